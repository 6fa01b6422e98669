"""Training: one loop (`loop.py`) for every algorithm; ES (`es.py`), the policy-gradient baselines (`pg/`),
the supervised warm start (`sft.py`). Each algorithm is one line of `TRAINERS` (imported on first use; an
import error is raised, never hidden) and one config class in `config.CONFIG_CLASSES`."""

from __future__ import annotations

from collections.abc import Callable

from esopt.utils.registry import lookup

TRAINERS: dict[str, str] = {"es": "esopt.train.es:train", "grpo": "esopt.train.pg.grpo:train",
                            "ppo": "esopt.train.pg.ppo:train"}


def trainer(algo: str) -> Callable[..., dict]:
    """train(config, out, resume=False, progress=True) -> summary, of the algorithm `algo`."""
    return lookup(TRAINERS, algo, "algorithm")
