"""Fitness shaping: pure functions from raw rewards (one per member) to update weights.

All share one signature, `f(rewards) -> np.ndarray`, and live in SHAPERS. A zero-variance population
(common with sparse rewards) gives all-zero weights and a ZeroVariancePopulation warning, never NaN.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np


class ZeroVariancePopulation(UserWarning):
    """Every member scored the same: the update is zero."""


def check_rewards(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be a 1-D sequence (one per member), got shape {r.shape}")
    if r.size == 0:
        raise ValueError("rewards is empty: the population needs at least one member")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise ValueError(f"reward of member {int(bad[0])} is {r[bad[0]]}: rewards must be finite")
    return r


def _zero_update(n: int) -> np.ndarray:
    warnings.warn("all rewards are equal: zero update this generation", ZeroVariancePopulation, stacklevel=3)
    return np.zeros(n)


def identity(rewards) -> np.ndarray:
    return check_rewards(rewards).copy()


def zscore(rewards, eps: float = 1e-8) -> np.ndarray:
    """(r - mean) / (std + eps) with ddof 0, as in the paper."""
    r = check_rewards(rewards)
    std = r.std()
    if std <= eps:
        return _zero_update(r.size)
    return (r - r.mean()) / (std + eps)


def centered_rank(rewards) -> np.ndarray:
    """Ranks mapped to [-0.5, 0.5]; tied rewards share their average rank (OpenAI ES)."""
    r = check_rewards(rewards)
    if r.size == 1 or np.all(r == r[0]):
        return _zero_update(r.size)
    _, inverse, counts = np.unique(r, return_inverse=True, return_counts=True)
    first_rank = np.concatenate([[0], np.cumsum(counts)[:-1]])
    avg_rank = first_rank + (counts - 1) / 2.0
    return avg_rank[inverse] / (r.size - 1) - 0.5


SHAPERS: dict[str, Callable[[Sequence[float]], np.ndarray]] = {
    "zscore": zscore,
    "centered_rank": centered_rank,
    "identity": identity,
}


def get_shaper(name: str) -> Callable[[Sequence[float]], np.ndarray]:
    if name not in SHAPERS:
        raise ValueError(f"unknown shaping {name!r}; choose one of {sorted(SHAPERS)}")
    return SHAPERS[name]
