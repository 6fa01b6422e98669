#!/usr/bin/env bash
# Packs what a lent GPU machine (the `device` tool's nvidia-h200) lacks into .device/a and .device/b, each under
# the 64 MiB a call may carry: the SmolLM2 GGUF in two halves, and wheels of the few dependencies its image has
# not (its python3 is 3.12; it has torch, transformers, numpy, scipy, yaml, tqdm, matplotlib, ...).
# Run here, in the repo root, after `make venv`:  bash tools/device/pack.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=.device
grep -qx "/$OUT/" .git/info/exclude 2>/dev/null || echo "/$OUT/" >> .git/info/exclude  # never committed
rm -rf "$OUT" && mkdir -p "$OUT/a/wheels" "$OUT/b"

gguf=$($PY -c "from esopt.models.smollm2 import find_gguf; print(find_gguf())")
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
split -b "$half" -d -a 1 "$gguf" "$OUT/gguf.part"
mv "$OUT/gguf.part0" "$OUT/a/" && mv "$OUT/gguf.part1" "$OUT/b/"
sha256sum "$gguf" | cut -d' ' -f1 > "$OUT/a/gguf.sha256"

# the versions this venv runs (pydantic and pydantic-core must match each other)
pins=$($PY - <<'PY'
from importlib.metadata import version
print(" ".join(f"{d}=={version(d)}" for d in ("gguf", "gymnasium", "farama-notifications", "pydantic",
                                             "pydantic-core", "annotated-types", "typing-inspection")))
PY
)
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$OUT/a/wheels" $pins
du -sh "$OUT/a" "$OUT/b"
echo "packed: call A carries .device/a, call B .device/b (tools/device/README.md)"
