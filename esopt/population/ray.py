"""Ray population workers: each actor holds a model replica and its envs; only seeds, sigma, ledger lines,
rewards and trajectories cross the wire.

- Start-up: a replica loads the base model and replays the ledger so far (the same bytes as the driver's
  weights); after that no weights travel.
- Per generation: members are dispatched dynamically (an actor pool), one actor call per member; the call
  perturbs, rolls out and restores (on failure too) and returns the member's trajectories.
- After `tell`, every replica applies the generation's ledger line itself (`sync`) and reports a checksum of
  its weights; a replica that disagrees with the driver is reported as drifted and replaced.
- A replica that dies or hangs past `timeout_s` is replaced by a fresh one (base + ledger), and its
  unfinished members run again: with common random numbers a re-run gives the same episodes. A call's
  time counts from when its replica is up, so a slow start-up (loading, replaying) is not taken for a hang.

    distributed: {backend: ray, workers: 2}          # or `esopt train CFG --workers 2`
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from esopt.es import Member
from esopt.population.base import PopulationContext, ReplicaParts, run_member
from esopt.rollout import RolloutSpec


def weights_checksum(model: torch.nn.Module) -> str:
    """A hash of every parameter's bytes: equal iff the replicas hold identical weights."""
    h = hashlib.blake2b(digest_size=16)
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Replica:
    """One worker's model, envs and perturbation (a Ray actor class; plain Python in tests). `setup` builds them
    from the run's config in the worker (the training layer provides it); the ledger so far is replayed."""

    def __init__(self, setup: Callable[[], ReplicaParts], records: list[dict], threads: int = 1):
        from esopt.es import ES

        torch.set_num_threads(threads)
        parts = setup()
        self.policy, self.make_env, self.score = parts.engine, parts.make_env, parts.score
        self.es = ES(self.policy.model, parts.es_config, on_weights_changed=self.policy.weights_changed)
        self.es.fast_forward(records)  # the ledger so far, through this replica's own perturbation

    def evaluate(self, member: Member, sigma: float, task_seeds: list[int], rollout_seed: int, spec: RolloutSpec):
        return run_member(self.es, self.policy, spec, self.make_env, member, sigma, task_seeds, rollout_seed,
                          self.score)

    def sync(self, record: dict) -> str:
        from esopt.es import apply_record

        apply_record(self.es.perturbation, record)
        self.policy.weights_changed()
        return weights_checksum(self.policy.model)

    def checksum(self) -> str:
        return weights_checksum(self.policy.model)

    def corrupt(self) -> None:
        """Tests: make this replica drift (its fp32 master copy too, which the next update starts from)."""
        with torch.no_grad():
            next(self.policy.model.parameters()).view(-1)[0] += 1.0
            masters = self.es.perturbation.masters
            if masters is not None:
                masters[0][0] += 1.0


def local_ray_dir(run_dir: Path) -> Path:
    """RUN/ray for the local cluster's files. Ray's unix sockets need a path under ~107 bytes, so a deep run
    dir gets a short directory in /tmp instead, linked from RUN/ray."""
    link = run_dir.resolve() / "ray"
    if link.is_symlink():
        return link.resolve()
    if len(str(link)) <= 40:
        link.mkdir(parents=True, exist_ok=True)
        return link
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="esopt-ray-"))
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(short, target_is_directory=True)
    return short


class ReplicaDrift(RuntimeError):
    pass


class RayEvaluator:
    """`Evaluator` over Ray actors (see the module docstring)."""

    def __init__(self, context: PopulationContext):
        import ray

        if context.replica_setup is None or context.distributed is None:
            raise ValueError("the ray evaluator needs a replica_setup and the distributed settings")
        d, run_dir = context.distributed, context.run_dir or Path("runs/ray")
        if not ray.is_initialized():
            if d.address:
                ray.init(address=d.address, include_dashboard=False, log_to_driver=False)
            else:  # a local cluster whose files live in the run dir
                tmp = local_ray_dir(Path(run_dir))
                ray.init(num_cpus=d.workers, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp),
                         runtime_env={"env_vars": {"OMP_NUM_THREADS": str(d.threads_per_worker)}})
        self.ray, self.settings, self.model, self.log = ray, d, context.engine.model, context.log
        self.setup = context.replica_setup
        self.worker_lost = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError)
        self.records = list(context.records)
        self.actor_class = ray.remote(num_cpus=1, num_gpus=d.gpus_per_worker, max_restarts=0)(Replica)
        self.starting: dict = {}  # actor -> a call that returns once its replica is built
        self.actors = [self._new_actor() for _ in range(d.workers)]
        self.replaced = 0

    def _new_actor(self):
        actor = self.actor_class.remote(self.setup, self.records, self.settings.threads_per_worker)
        self.starting[actor] = actor.checksum.remote()
        return actor

    def _up(self, actor) -> bool:
        """The actor's replica is built (or its start-up failed, which its next call reports)."""
        ready = self.starting.get(actor)
        if ready is not None and self.ray.wait([ready], timeout=0)[0]:
            del self.starting[actor]
        return actor not in self.starting

    def _replace(self, actor, why: str) -> object:
        self.ray.kill(actor, no_restart=True)
        self.starting.pop(actor, None)
        fresh = self._new_actor()
        self.actors[self.actors.index(actor)] = fresh
        self.replaced += 1
        self.log(f"worker replaced ({why}); it rebuilds its weights from the base model + {len(self.records)} "
                 "ledger lines")
        return fresh

    def evaluate(self, members: Sequence[Member], sigma: float, task_seeds: list[int], rollout_seed: int,
                 spec: RolloutSpec) -> list:
        """Dynamic dispatch: each idle actor takes the next member; a failed or hung call is re-queued."""
        timeout = self.settings.timeout_s
        todo, results = list(members), {}
        running: dict = {}  # object ref -> [actor, member, started (None until the replica is up)]
        idle = list(self.actors)
        while todo or running:
            while todo and idle:
                actor, member = idle.pop(), todo.pop(0)
                running[actor.evaluate.remote(member, sigma, task_seeds, rollout_seed, spec)] = [actor, member, None]
            done, _ = self.ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in done:
                actor, member, _ = running.pop(ref)
                try:
                    results[member.index] = self.ray.get(ref)
                    idle.append(actor)
                except self.worker_lost as e:
                    idle.append(self._replace(actor, f"died while evaluating member {member.index}: "
                                                     f"{type(e).__name__}"))
                    todo.insert(0, member)
            for ref, entry in list(running.items()):
                actor, member, started = entry
                if started is None and self._up(actor):
                    entry[2] = started = time.time()
                if started is not None and time.time() - started > timeout:
                    running.pop(ref)
                    idle.append(self._replace(actor, f"member {member.index} ran past {timeout:.0f}s"))
                    todo.insert(0, member)
        return [results[m.index] for m in members]

    def sync(self, record: dict) -> None:
        """Every replica applies the ledger line; any replica whose weights differ from the driver's is replaced."""
        self.records.append(record)  # a replacement replays it too
        expected = weights_checksum(self.model)
        refs = [(a, a.sync.remote(record)) for a in list(self.actors)]
        drifted = []
        for actor, ref in refs:
            try:
                if self.ray.get(ref) != expected:
                    drifted.append(actor)
            except self.worker_lost:
                self._replace(actor, "died during the update")
        for actor in drifted:
            self._replace(actor, "its weights drifted from the driver's after the update")
        if drifted:
            fresh = self.ray.get([a.checksum.remote() for a in self.actors])
            if any(s != expected for s in fresh):
                raise ReplicaDrift("replicas rebuilt from the ledger still differ from the driver's weights")

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.ray.shutdown()
