"""Policy backends: `HFPolicy` over any local `transformers` causal LM, the tiny char Llama, SmolLM2."""

from __future__ import annotations

from pathlib import Path

from esopt.policies.base import Generation, Policy, SamplingParams
from esopt.policies.hf import HFPolicy, resolve_device, resolve_dtype
from esopt.policies.smollm2 import smollm2_path
from esopt.policies.tiny import TinyConfig, build_char_tokenizer, build_tiny_model

__all__ = [
    "Generation",
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


def load_policy(
    spec: str, dtype: str = "auto", device: str = "cpu", cache_dir: str | Path | None = None
) -> HFPolicy:
    """Build a policy from a spec: "tiny" (fresh random tiny Llama, seed 0), "smollm2", a local HF
    model dir, or a `.gguf` file path. dtype "auto": see `model_dtype`."""
    dtype = model_dtype(spec, dtype)
    if spec == "tiny":
        model, tokenizer = build_tiny_model(seed=0)
        model = model.to(device=resolve_device(device), dtype=resolve_dtype(dtype))
        return HFPolicy(model, tokenizer)
    if spec == "smollm2":
        return HFPolicy.from_pretrained(smollm2_path(cache_dir), dtype=dtype, device=device)
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"unknown policy {spec!r}: use 'tiny', 'smollm2', a local model directory or a .gguf file"
        )
    return HFPolicy.from_pretrained(path, dtype=dtype, device=device)
