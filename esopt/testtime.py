"""Test-time compute: several rollouts per task, combined.

With n independent episodes of a task (different sampling seeds):
- Mean@n: the mean success over the n episodes (what one sample scores on average);
- Pass@k: the chance that at least one of k episodes succeeds, the unbiased estimator
  1 - C(n - c, k) / C(n, k) with c successes among n (Chen et al. 2021);
- best-of-n with the env's verifier: the env's own success check picks an episode, so the task counts as
  solved when any episode is (Pass@n, reached by spending n rollouts at test time);
- majority vote: the most common final answer wins, and the task counts as solved if that answer's episodes
  succeeded. Answers compare by `info["answer"]` when the env gives one, else by the last action text
  (whitespace and case folded). Ties go to the answer seen first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

from esopt.rollout import Trajectory

T = TypeVar("T")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples with c successes."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def answer_key(t: Trajectory) -> str:
    """What a trajectory answered: the env's `answer` if it reports one, else its last action."""
    if not t.turns:
        return ""
    info = t.turns[-1].info
    if "answer" in info:
        return str(info["answer"])
    return " ".join(t.turns[-1].text.split()).lower()


def majority_vote(group: Sequence[Trajectory]) -> bool:
    """Success of the most common answer among one task's episodes."""
    if not group:
        raise ValueError("majority_vote needs at least one episode")
    keys = [answer_key(t) for t in group]
    counts = Counter(keys)
    top = max(counts.values())
    winner = next(k for k in keys if counts[k] == top)  # ties: the answer seen first
    return any(t.success for t, k in zip(group, keys) if k == winner)


def by_task(episodes: Sequence[T], samples: int) -> list[list[T]]:
    """Per-episode items laid out sample-major (task seeds repeated `samples` times), grouped per task."""
    if samples < 1 or len(episodes) % samples:
        raise ValueError(f"{len(episodes)} episodes do not split into {samples} samples per task")
    tasks = len(episodes) // samples
    return [[episodes[s * tasks + i] for s in range(samples)] for i in range(tasks)]


def summarize_test_time(trajectories: Sequence[Trajectory], samples: int) -> dict[str, float]:
    """Mean@n, Pass@k for k = 1..n, best-of-n (verifier) and vote@n over the tasks."""
    groups = by_task(trajectories, samples)
    n = samples
    out = {f"mean@{n}": sum(t.success for g in groups for t in g) / (n * len(groups))}
    for k in sorted({1, 2, 4, n} & set(range(1, n + 1))):
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(t.success for t in g), k) for g in groups) / len(groups)
    out[f"best_of_{n}"] = sum(any(t.success for t in g) for g in groups) / len(groups)
    out[f"vote@{n}"] = sum(majority_vote(g) for g in groups) / len(groups)
    return out
