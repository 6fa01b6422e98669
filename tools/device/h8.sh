#!/usr/bin/env bash
# On the device: issue 21's H*=8 cell (ES, GRPO, PPO x seeds 0 1 2, 9 processes under an MPS daemon) with the
# H*=4 H200 runs' settings (results/horizon_pretrained.md), for at most SECONDS; rerun the same call to resume.
# What it has so far comes back under $OUT: the log, horizon.md/.png, and h8_runs.tgz (the run dirs without
# weights, for `esopt bench horizon --report-only` here).
#   call A: bash tools/device/stage.sh                    carry [".device/a"]  timeout 120
#   call B: bash tools/device/h8.sh 560                   carry [".device/b"]  timeout 600 (within 30 s of A)
#   then:   bash tools/device/h8.sh 560                   (no carry; the machine must still be warm)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_LEFT=${1:-560}
STAGE=${STAGE:-/tmp/esopt-stage}
bash tools/device/stage.sh
[ -f "$STAGE/ready" ] || { echo "not staged: run call A (tools/device/stage.sh with .device/a) first"; exit 1; }
# shellcheck disable=SC1091
source "$STAGE/env.sh"
pgrep -f nvidia-cuda-mps-control >/dev/null || nvidia-cuda-mps-control -d  # the 9 runs' small kernels overlap
RUNS=$STAGE/h8
set +e
OMP_NUM_THREADS=1 timeout "$SECONDS_LEFT" python3 -m esopt.cli bench horizon --preset smollm2 --h-stars 8 \
    --seeds 0 1 2 --methods es grpo ppo --jobs 9 --resume --out "$RUNS" \
    --set model.device=cuda model.dtype=bfloat16 max_batch_size=256 es.sigma=4e-3 es.sigma_min=2e-3 \
          es.alpha=2e-3 grpo.lr=3e-5 ppo.lr=3e-5 grpo.micro_batch_size=32 ppo.micro_batch_size=32 \
          checkpoint_every=2 > "$STAGE/h8.log" 2>&1
rc=$?
set -e
[ $rc = 124 ] && echo "stopped at $SECONDS_LEFT s: rerun this call (it resumes)" || echo "bench exit code $rc"
if [ -n "${OUT:-}" ]; then  # at most 8 files come back: the log, the report, and every run minus its weights
    cp "$STAGE/h8.log" "$OUT/" || true
    cp "$RUNS"/horizon.md "$RUNS"/horizon.png "$OUT/" 2>/dev/null || true
    tar czf "$OUT/h8_runs.tgz" --exclude=final --exclude=checkpoints --exclude=tb --exclude=plots -C "$RUNS" . || true
fi
tail -20 "$STAGE/h8.log"
