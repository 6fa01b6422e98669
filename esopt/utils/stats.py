"""Small statistics for honest before/after comparisons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class PairedDifference(NamedTuple):
    mean: float  # mean of (after - before) over tasks
    low: float  # bootstrap percentile interval
    high: float
    tasks: int


def paired_difference(
    before: Sequence[float],
    after: Sequence[float],
    tasks: int,
    level: float = 0.95,
    resamples: int = 4000,
    seed: int = 0,
) -> PairedDifference:
    """Mean change of a per-episode score, with a bootstrap interval that resamples tasks.

    Episode i belongs to task i % tasks (the eval lays out `tasks` held-out seeds, repeated), and the
    before and after evals ran the same tasks with the same sampling seeds, so episodes pair up: the
    per-task difference removes the task-difficulty noise that two independent evals would carry.
    """
    b, a = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    if b.shape != a.shape or b.ndim != 1:
        raise ValueError(f"before and after must be 1-d and the same length, got {b.shape} and {a.shape}")
    if tasks < 1 or len(b) % tasks:
        raise ValueError(f"{len(b)} episodes do not split into {tasks} tasks")
    per_task = (a - b).reshape(-1, tasks).mean(axis=0)  # rows are repeats
    rng = np.random.default_rng(seed)
    means = per_task[rng.integers(0, tasks, size=(resamples, tasks))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return PairedDifference(float(per_task.mean()), float(low), float(high), tasks)


def mcnemar_p(before: Sequence[int], after: Sequence[int]) -> float:
    """Exact two-sided McNemar test on paired binary outcomes (binomial test on the discordant pairs)."""
    b = sum(1 for x, y in zip(before, after) if x and not y)
    c = sum(1 for x, y in zip(before, after) if y and not x)
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(min(b, c), b + c, 0.5).pvalue)
