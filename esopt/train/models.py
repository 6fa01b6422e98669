"""The run's model: a named model, a local directory, or a recipe that trains one first (cached on disk)."""

from __future__ import annotations

from collections.abc import Callable

from esopt.engines.hf import HFEngine
from esopt.models import NAMED_MODELS, load_policy
from esopt.train.config import ModelSection


def _tiny_sudoku(seed: int, size: int, steps: int) -> str:
    from esopt.train.sft import warm_start_path

    return str(warm_start_path(seed=seed, size=size, steps=steps))


# Named models built by a recipe: name -> (seed, size, steps) -> path of a local HF model directory.
MODEL_RECIPES: dict[str, Callable[..., str]] = {"tiny-sudoku": _tiny_sudoku}


def load_model(section: ModelSection, env_kwargs: dict | None = None) -> HFEngine:
    """The run's model; a recipe model ('tiny-sudoku') gets the env's board size and its warm-start steps."""
    if section.name in MODEL_RECIPES:
        size = int((env_kwargs or {}).get("size", 4))
        path = MODEL_RECIPES[section.name](seed=section.seed, size=size, steps=section.warm_start_steps)
        return load_policy(path, dtype=section.resolved_dtype, device=section.device, engine=section.engine)
    try:
        return load_policy(section.name, dtype=section.resolved_dtype, device=section.device, seed=section.seed,
                           engine=section.engine)
    except FileNotFoundError:
        known = ", ".join(repr(k) for k in (*NAMED_MODELS, *MODEL_RECIPES))
        raise FileNotFoundError(f"unknown model {section.name!r}: use {known}, a local model directory or a .gguf "
                                "file") from None
