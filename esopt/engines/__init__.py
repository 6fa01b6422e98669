"""Inference engines: the `Engine` protocol (`base.py`) and its implementations, one file each and one line
each in `ENGINES` (a class, or "module:Class" imported on first use; an import error is raised, never
hidden). An engine class is built by `cls(model, tokenizer)` or `cls.from_pretrained(path, dtype, device)`."""

from __future__ import annotations

import importlib

from esopt.engines.base import Completion, Engine, MemberRouter, SamplingParams

ENGINES: dict[str, type | str] = {"hf": "esopt.engines.hf:HFEngine"}


def engine_class(name: str) -> type:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; registered: {sorted(ENGINES)}")
    target = ENGINES[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    return target


__all__ = ["ENGINES", "Completion", "Engine", "MemberRouter", "SamplingParams", "engine_class"]
