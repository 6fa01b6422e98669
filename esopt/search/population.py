"""The EoH population: individuals, rank-based parent selection and greedy management.

Selection (EoH's `prob_rank`): the population sorted by objective, rank r (0 = best) drawn with probability
proportional to 1 / (r + 1 + N). Two-parent operators draw two different parents when the population has
two members. Management (EoH's `pop_greedy`): merge, drop invalid heuristics and repeated objectives
(first seen kept, so a seeded baseline is never displaced by a copy of itself), keep the best N.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Individual:
    text: str  # what the level shows the model
    code: str  # the whole function
    objective: float  # train objective, lower is better (only valid heuristics are individuals)
    origin: str  # "seed:<name>" or "<operator>@<batch>.<proposal>" (unique in a run)

    def to_dict(self) -> dict:
        return asdict(self)


def rank_probabilities(n: int) -> np.ndarray:
    if n < 1:
        raise ValueError("selection needs a non-empty population")
    w = 1.0 / (np.arange(n) + 1.0 + n)
    return w / w.sum()


def select(population: list[Individual], k: int, rng: np.random.Generator) -> list[Individual]:
    """k parents by rank (population sorted best first); distinct when the population allows."""
    if k == 0:
        return []
    ranked = sorted(population, key=lambda x: x.objective)
    replace = len(ranked) < k
    picks = rng.choice(len(ranked), size=k, replace=replace, p=rank_probabilities(len(ranked)))
    return [ranked[int(i)] for i in picks]


def manage(population: list[Individual], offspring: list[Individual], size: int) -> list[Individual]:
    """The best `size` distinct-objective individuals of population + offspring, best first."""
    seen: set[float] = set()
    kept = []
    for ind in [*population, *offspring]:
        if ind.objective in seen or not np.isfinite(ind.objective):
            continue
        seen.add(ind.objective)
        kept.append(ind)
    kept.sort(key=lambda x: x.objective)  # stable: ties keep their order
    return kept[:size]
