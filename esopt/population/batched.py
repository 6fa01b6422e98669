"""All members' episodes in one batched rollout: the base weights stay untouched and every batch row computes
with its own member's weights (`esopt.es.batched`: low-rank terms added per row, EGGROLL, or dense per-member
copies for full-rank noise). Member i runs rows
[i*E, (i+1)*E). Greedy decoding gives each member exactly the episodes the local evaluator would; sampled
decoding draws from other random streams (the batch is larger).

With `members_per_rollout` = k the members run k at a time, one rollout each block: every member holds its
own prefix KV while its episodes decode, so a block of k holds k of them instead of G (less memory, smaller
decode batches, the same prefix work)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from esopt.es import Member
from esopt.es.batched import member_router
from esopt.population.base import MemberResult, PopulationContext, member_score
from esopt.rollout import RolloutSpec, RolloutStats


class BatchedEvaluator:
    def __init__(self, context: PopulationContext):
        self.context = context
        self.host = member_router(context.engine.model, context.es.perturbation)

    def evaluate(self, members: Sequence[Member], sigma: float, task_seeds: list[int], rollout_seed: int,
                 spec: RolloutSpec) -> list[MemberResult]:
        c, e = self.context, len(task_seeds)
        k = c.members_per_rollout or len(members)
        trajectories = []
        for lo in range(0, len(members), k):
            block = members[lo:lo + k]
            owners = [i for i in range(len(block)) for _ in range(e)]  # the member (in the block) of every episode
            t0 = time.perf_counter()
            with self.host.members(block, sigma), c.engine.route_members(self.host):
                t1 = time.perf_counter()
                done, _ = spec.run(c.engine, c.make_env, task_seeds * len(block), seed=rollout_seed, members=owners)
                t2 = time.perf_counter()
            trajectories += done
            c.timers.perturb += t1 - t0
            c.timers.rollout += t2 - t1
        results = []
        for i, m in enumerate(members):
            own = trajectories[i * e:(i + 1) * e]
            stats = RolloutStats(episodes=e, generated_tokens=sum(t.generated_tokens for t in own))
            results.append(MemberResult(m.index, member_score(own, c.score), own, stats))
        return results

    def sync(self, record: dict) -> None:
        """Nothing to do: the shared model was updated by `ES.tell`."""

    def close(self) -> None:
        pass
