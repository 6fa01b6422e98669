"""Which tasks a run sees: the env factory and the seed ranges of training, validation and test tasks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from esopt.train.config import BaseTrainConfig

# Training and held-out task seeds come from disjoint ranges, so no held-out seed is ever trained on.
TRAIN_SEED_RANGE = (0, 2**31)
HELDOUT_SEED_BASE = 2**31


def env_factory(config: BaseTrainConfig) -> Callable:
    from esopt.envs import make_env

    env_id, kwargs = config.env.id, dict(config.env.kwargs)
    make_env(env_id, **kwargs).close()  # fail fast, with the env's own message, on bad kwargs
    return lambda: make_env(env_id, **kwargs)


def train_task_seeds(seed: int, step: int, count: int) -> list[int]:
    rng = np.random.default_rng([seed, step, 7])
    return [int(s) for s in rng.integers(*TRAIN_SEED_RANGE, size=count)]


def task_pool_seeds(seed: int, count: int) -> list[int]:
    """A fixed training pool (es.task_set=fixed): drawn once from the training range, reused every generation."""
    rng = np.random.default_rng([seed, 7, 2**20])
    return [int(s) for s in rng.integers(*TRAIN_SEED_RANGE, size=count)]


def heldout_task_seeds(config: BaseTrainConfig) -> list[int]:
    """Held-out tasks of `config.eval.split`: test seeds lie in [2^31, 2^31 + 2^30), validation seeds in
    [2^31 + 2^30, 2^32), training seeds below 2^31, so the three never share a seed."""
    rng = np.random.default_rng([config.eval.seed, 11])
    base = HELDOUT_SEED_BASE + (2**30 if config.eval.split == "validation" else 0)
    return [base + int(s) for s in rng.integers(0, 2**30, size=config.eval.tasks)]
