"""Policy backends: `HFPolicy` over any local `transformers` causal LM, the tiny char Llama, SmolLM2."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from esopt.policies.base import Completion, Policy, SamplingParams

if TYPE_CHECKING:
    from esopt.policies.hf import HFPolicy

# heavy backends (transformers) load on first use, so config checks and CLI errors stay fast
_LAZY = {"HFPolicy": "esopt.policies.hf", "resolve_device": "esopt.policies.hf", "resolve_dtype": "esopt.policies.hf",
         "smollm2_path": "esopt.policies.smollm2", "TinyConfig": "esopt.policies.tiny",
         "build_char_tokenizer": "esopt.policies.tiny", "build_tiny_model": "esopt.policies.tiny"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'esopt.policies' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "Completion",
    "HFPolicy",
    "Policy",
    "SamplingParams",
    "TinyConfig",
    "build_char_tokenizer",
    "build_tiny_model",
    "load_policy",
    "model_dtype",
    "smollm2_path",
]


def model_dtype(spec: str, dtype: str = "auto") -> str:
    """"auto": bfloat16 for SmolLM2 (3.5-4x faster than fp32 on CPUs with AMX-BF16, and on GPUs), float32
    for everything else (the tiny test model, local dirs whose dtype the caller knows)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if spec == "smollm2" else "float32"


# Named models built by a recipe (cached on disk), imported on first use: name -> "module:function".
# A recipe takes (seed, **options) and returns the path of a local HF model directory.
MODEL_RECIPES: dict[str, str] = {"tiny-sudoku": "esopt.envs.sudoku_warm_start:warm_start_path"}


def load_policy(spec: str, dtype: str = "auto", device: str = "cpu", cache_dir: str | Path | None = None,
                seed: int = 0, **options) -> HFPolicy:
    """The one model factory. `spec`: "tiny" (a fresh random tiny Llama from `seed`), a recipe name
    ("tiny-sudoku": the tiny Llama warm-started on Sudoku demos; options `size`, `steps`), "smollm2",
    a local HF model directory, or a `.gguf` file. dtype "auto": see `model_dtype`; device "auto":
    CUDA when available."""
    from esopt.policies.hf import HFPolicy, resolve_device, resolve_dtype
    from esopt.policies.smollm2 import smollm2_path
    from esopt.policies.tiny import build_tiny_model

    dtype = model_dtype(spec, dtype)
    if options and spec not in MODEL_RECIPES:
        raise ValueError(f"model {spec!r} takes no options, got {sorted(options)}")
    if spec == "tiny":
        model, tokenizer = build_tiny_model(seed=seed)
        model = model.to(device=resolve_device(device), dtype=resolve_dtype(dtype))
        return HFPolicy(model, tokenizer)
    if spec in MODEL_RECIPES:
        module, _, func = MODEL_RECIPES[spec].partition(":")
        path = getattr(importlib.import_module(module), func)(seed=seed, **options)
        return HFPolicy.from_pretrained(path, dtype=dtype, device=device)
    if spec == "smollm2":
        return HFPolicy.from_pretrained(smollm2_path(cache_dir), dtype=dtype, device=device)
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"unknown model {spec!r}: use 'tiny', {', '.join(repr(k) for k in MODEL_RECIPES)}, 'smollm2', "
            "a local model directory or a .gguf file"
        )
    return HFPolicy.from_pretrained(path, dtype=dtype, device=device)
