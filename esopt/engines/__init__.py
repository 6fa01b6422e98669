"""Inference engines: the `Engine` protocol (`base.py`) and its implementations, one file each and one line
each in `ENGINES` (a class, or "module:Class" imported on first use; an import error is raised, never
hidden). An engine class is built by `cls(model, tokenizer)` or `cls.from_pretrained(path, dtype, device)`."""

from __future__ import annotations

from esopt.engines.base import Completion, Engine, MemberRouter, SamplingParams
from esopt.utils.registry import lookup

ENGINES: dict[str, type | str] = {"hf": "esopt.engines.hf:HFEngine"}


def engine_class(name: str) -> type:
    return lookup(ENGINES, name, "engine")


__all__ = ["ENGINES", "Completion", "Engine", "MemberRouter", "SamplingParams", "engine_class"]
