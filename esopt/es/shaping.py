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


def task_normalized(scores, eps: float = 1e-8) -> np.ndarray:
    """Member fitness with a per-task baseline (EGGROLL's group normalisation): `scores` is (members, tasks);
    each task's column is z-scored across the members that ran it, then averaged per member. A task every
    member scored alike (all solved, all failed) carries no signal and adds 0, instead of letting easy or
    impossible tasks dominate the mean."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.size == 0:
        raise ValueError(f"scores must be a non-empty (members, tasks) array, got shape {s.shape}")
    check_rewards(s.ravel())
    std = s.std(axis=0)
    z = np.where(std > eps, (s - s.mean(axis=0)) / np.where(std > eps, std, 1.0), 0.0)
    return z.mean(axis=1)


def pair_disagreement(rewards, signs) -> float:
    """Share of antithetic pairs (members 2k, 2k+1) whose two rewards differ: how often the population
    sees any signal at all (0 with a noise scale too small to change behaviour)."""
    r = check_rewards(rewards)
    if len(signs) != r.size or r.size % 2 or any(signs[k] != -signs[k + 1] for k in range(0, r.size, 2)):
        raise ValueError("pair_disagreement needs an antithetic population (members 2k, 2k+1 mirrored)")
    return float(np.mean(r[0::2] != r[1::2]))


SHAPERS: dict[str, Callable[[Sequence[float] | np.ndarray], np.ndarray]] = {
    "zscore": zscore,
    "centered_rank": centered_rank,
    "identity": identity,
}


def get_shaper(name: str) -> Callable[[Sequence[float] | np.ndarray], np.ndarray]:
    if name not in SHAPERS:
        raise ValueError(f"unknown shaping {name!r}; choose one of {sorted(SHAPERS)}")
    return SHAPERS[name]
