"""Members one after another on the single local model, perturbed in place and restored exactly."""

from __future__ import annotations

from collections.abc import Sequence

from esopt.es import Member
from esopt.population.base import MemberResult, PopulationContext, run_member
from esopt.rollout import RolloutSpec
from esopt.utils.progress import progress_bar


class LocalEvaluator:
    def __init__(self, context: PopulationContext):
        self.context = context

    def evaluate(self, members: Sequence[Member], sigma: float, task_seeds: list[int], rollout_seed: int,
                 spec: RolloutSpec) -> list[MemberResult]:
        c = self.context
        bar = progress_bar(len(members), "members", leave=False) if c.progress else None
        results = []
        for m in members:
            results.append(run_member(c.es, c.engine, spec, c.make_env, m, sigma, task_seeds, rollout_seed, c.score,
                                      c.timers))
            if bar:
                bar.update(1)
        if bar:
            bar.close()
        return results

    def sync(self, record: dict) -> None:
        """Nothing to do: this evaluator shares the model `ES.tell` just updated."""

    def close(self) -> None:
        pass
