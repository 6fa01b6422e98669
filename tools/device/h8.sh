#!/usr/bin/env bash
# On the device: issue 21's H*=8 cell (ES, GRPO, PPO x seeds 0 1 2, 9 processes under an MPS daemon) with the
# H*=4 H200 runs' settings (results/horizon_pretrained.md), for at most SECONDS; rerun the same call to resume.
# What it has so far comes back under $OUT: the log, horizon.md/.png, and h8_runs.tgz (the run dirs without
# weights, for `esopt bench horizon --report-only` here).
#   call A: bash tools/device/stage.sh                    carry [".device/a"]  timeout 120
#   call B: bash tools/device/h8.sh 500                   carry [".device/b"]  timeout 600 (within 30 s of A)
#   then:   bash tools/device/h8.sh SECONDS               (no carry; the machine must still be warm)
# The runs get SECONDS, then SIGINT (each saves a checkpoint, as on Ctrl-C) and at most 60 s to exit, so a call
# with timeout_s >= SECONDS + 90 returns its files.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_LEFT=${1:-500}
STAGE=${STAGE:-/tmp/esopt-stage}
bash tools/device/stage.sh
[ -f "$STAGE/ready" ] || { echo "not staged: run call A (tools/device/stage.sh with .device/a) first"; exit 1; }
# shellcheck disable=SC1091
source "$STAGE/env.sh"
if command -v nvidia-cuda-mps-control >/dev/null; then  # the 9 runs' small kernels overlap (it stays up)
    pgrep -f nvidia-cuda-mps-control >/dev/null || nvidia-cuda-mps-control -d
fi
RUNS=$STAGE/h8
set +e
# timeout signals its whole process group: every run gets the SIGINT, like a terminal's Ctrl-C
OMP_NUM_THREADS=1 timeout -s INT -k 60 "$SECONDS_LEFT" python3 -m esopt.cli bench horizon --preset smollm2 --h-stars 8 \
    --seeds 0 1 2 --methods es grpo ppo --jobs 9 --resume --out "$RUNS" \
    --set model.device=cuda model.dtype=bfloat16 max_batch_size=256 es.sigma=4e-3 es.sigma_min=2e-3 \
          es.alpha=2e-3 grpo.lr=3e-5 ppo.lr=3e-5 grpo.micro_batch_size=32 ppo.micro_batch_size=32 \
          checkpoint_every=1 > >(tee -a "$STAGE/h8.log" ${OUT:+"$OUT/h8.log"} > /dev/null) 2>&1
rc=$?
set -e
if [ -f "$RUNS/horizon.md" ] && [ "$rc" = 0 ]; then echo "all 9 runs done"
else echo "stopped (exit code $rc) after $SECONDS_LEFT s or earlier: rerun this call while the machine is warm (it resumes)"; fi
if [ -n "${OUT:-}" ]; then  # at most 8 files come back: the log, the report, and every run minus its weights
    cp "$STAGE/h8.log" "$OUT/h8.log" || true  # every call's log, appended
    cp "$RUNS"/horizon.md "$RUNS"/horizon.png "$OUT/" 2>/dev/null || true
    tar czf "$OUT/h8_runs.tgz" --exclude=final --exclude=checkpoints --exclude=tb --exclude=plots -C "$RUNS" . || true
fi
tail -20 "$STAGE/h8.log"
