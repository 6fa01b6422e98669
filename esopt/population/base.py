"""What every population evaluator shares: the protocol, its inputs, one member's evaluation, its result.

An evaluator takes a generation's members (seeds and signs), sigma, the tasks and the rollout settings, and
returns one scalar reward per member with its trajectories; after `ES.tell` it applies the generation's
ledger line to whatever weights it holds (`sync`). The ES math stays in `esopt.es`; where and how members
run (one by one in place, all at once in one batch, on Ray replicas) is an evaluator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from esopt.engines.base import Engine
from esopt.es import ES, Member
from esopt.rollout import RolloutSpec, RolloutStats, Trajectory, trajectory_score
from esopt.utils.faults import pause_point
from esopt.utils.timers import Timers


@dataclass
class MemberResult:
    index: int
    reward: float
    trajectories: list[Trajectory]
    stats: RolloutStats


@dataclass
class PopulationContext:
    """What an evaluator is built from (each kind reads the fields it needs)."""

    es: ES
    engine: Engine
    make_env: Callable
    score: str = "env"  # how an episode becomes a scalar (`trajectory_score` kind)
    timers: Timers = field(default_factory=Timers)
    progress: bool = False
    log: Callable[[str], None] = print
    # remote replicas rebuild the model and envs themselves: a picklable () -> ReplicaParts, the ledger so far
    replica_setup: Callable[[], ReplicaParts] | None = None
    records: list[dict] = field(default_factory=list)
    run_dir: Path | None = None
    distributed: Any = None  # the run's `distributed` section (workers, threads, timeout, address)
    members_per_rollout: int | None = None  # batched: members rolled out together (None: all)


@dataclass
class ReplicaParts:
    """What a remote replica builds for itself from the run's config (its ES is made after the replay)."""

    es_config: Any  # an ESConfig with the run's schedule length and seed
    engine: Engine
    make_env: Callable
    score: str


class Evaluator(Protocol):
    def evaluate(self, members: Sequence[Member], sigma: float, task_seeds: list[int], rollout_seed: int,
                 spec: RolloutSpec) -> list[MemberResult]:
        """Every member, perturbed by sigma * sign * eps(seed), runs `task_seeds`; one result per member."""
        ...

    def sync(self, record: dict) -> None:
        """Apply one generation's ledger line to the evaluator's weights (after `tell`)."""
        ...

    def close(self) -> None:
        """Release workers and clusters."""
        ...


def member_score(trajectories: list[Trajectory], kind: str) -> float:
    """Mean episode score of one member (see `trajectory_score`)."""
    return float(np.mean([trajectory_score(t, kind) for t in trajectories]))


def run_member(es: ES, engine: Engine, spec: RolloutSpec, make_env: Callable, member: Member, sigma: float,
               task_seeds: list[int], rollout_seed: int, score: str, timers: Timers | None = None) -> MemberResult:
    """One member: perturb in place, roll out `task_seeds`, restore (on failure too), score."""
    t0 = time.perf_counter()
    with es.perturbed(member, sigma):
        t1 = time.perf_counter()
        pause_point("rollout", member=member.index)  # tests: kill a worker while it holds a member
        trajectories, stats = spec.run(engine, make_env, task_seeds, seed=rollout_seed)
        t2 = time.perf_counter()
    if timers is not None:
        timers.perturb += t1 - t0
        timers.rollout += t2 - t1
        timers.restore += time.perf_counter() - t2
    return MemberResult(member.index, member_score(trajectories, score), trajectories, stats)
