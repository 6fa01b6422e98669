"""ES fine-tuning of an LLM agent, top to bottom (the loop around it is `loop.py`, shared with GRPO/PPO).

Per generation: ask G member seeds -> every member, perturbed in place, runs the same E tasks (common
random numbers) -> one scalar reward per member -> shaping -> theta += alpha/G sum w_i eps_i -> one
ledger line. The ledger (history.jsonl) is the source of truth: resume = last checkpoint + replay of
the generations after it, bit-exact in fp32, so a run killed at any moment continues as if never stopped.

Population evaluation sits behind `PopulationEvaluator`: members, sigma and tasks in, rewards and
trajectories out, plus `sync(record)`, which applies a generation's ledger line to the evaluator's own
weights. `LocalEvaluator` perturbs the one local model (already updated by `tell`, so its sync does
nothing); a Ray replica or a batched low-rank backend needs only these two calls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from esopt.es import ES, Ledger, Member, read_history, replay
from esopt.es.shaping import pair_disagreement, task_normalized
from esopt.policies import HFPolicy, load_policy
from esopt.prompt.program import PromptStore, PromptVersion
from esopt.rollout import RolloutStats, Trajectory, resolve_system_prompt
from esopt.train import loop
from esopt.train.common import (
    RunDir,
    Timers,
    load_model,
    progress_bar,
    rollout,
    say,
    summarize,
    task_pool_seeds,
    train_task_seeds,
    trajectory_score,
)
from esopt.train.config import ESTrainConfig
from esopt.utils.signals import defer_sigint


@dataclass
class MemberResult:
    index: int
    reward: float
    trajectories: list[Trajectory]
    stats: RolloutStats


class PopulationEvaluator(Protocol):
    def evaluate(self, members: Sequence[Member], sigma: float, task_seeds: list[int], rollout_seed: int
                 ) -> list[MemberResult]:
        """Every member, perturbed by sigma * sign * eps(seed), runs `task_seeds`; one result per member."""
        ...

    def sync(self, record: dict) -> None:
        """Apply one generation's ledger line to the evaluator's weights (after `tell`)."""
        ...


def member_score(trajectories: list[Trajectory], kind: str) -> float:
    """Mean episode score of one member (see `trajectory_score`)."""
    return float(np.mean([trajectory_score(t, kind) for t in trajectories]))


def generation_tasks(config: ESTrainConfig, generation: int) -> list[int]:
    """The E task seeds every member of this generation runs (common random numbers).

    fresh: new tasks each generation. fixed: a pool drawn once (the paper reuses its 32 training puzzles);
    all of it every generation when the pool is E tasks, else E of them sampled per generation."""
    e = config.es
    if e.task_set == "fresh":
        return train_task_seeds(config.seed, generation, e.tasks_per_member)
    pool = task_pool_seeds(config.seed, e.task_pool or e.tasks_per_member)
    if len(pool) == e.tasks_per_member:
        return pool
    pick = np.random.default_rng([config.seed, generation, 13]).choice(len(pool), e.tasks_per_member, replace=False)
    return [pool[int(i)] for i in pick]


def population_fitness(results: Sequence[MemberResult], config: ESTrainConfig) -> np.ndarray:
    """One fitness per member, before shaping: its mean score, or the per-task z-scored mean."""
    if config.es.fitness == "mean":
        return np.array([r.reward for r in results])
    scores = [[trajectory_score(t, config.es.reward) for t in r.trajectories] for r in results]
    return task_normalized(np.array(scores))


def run_member(es: ES, policy: HFPolicy, config: ESTrainConfig, make_env: Callable, member: Member, sigma: float,
               task_seeds: list[int], rollout_seed: int, system_prompt: str | None = None,
               timers: Timers | None = None) -> MemberResult:
    """One member: perturb in place, roll out `task_seeds`, restore (on failure too), score."""
    t0 = time.perf_counter()
    with es.perturbed(member, sigma):
        t1 = time.perf_counter()
        trajectories, stats = rollout(policy, config, make_env, task_seeds, seed=rollout_seed,
                                      system_prompt=system_prompt)
        t2 = time.perf_counter()
    if timers is not None:
        timers.perturb += t1 - t0
        timers.rollout += t2 - t1
        timers.restore += time.perf_counter() - t2
    return MemberResult(member.index, member_score(trajectories, config.es.reward), trajectories, stats)


class LocalEvaluator:
    """Evaluates members one after another on the single local model, perturbed in place."""

    def __init__(self, es: ES, policy: HFPolicy, make_env: Callable, config: ESTrainConfig, timers: Timers,
                 progress: bool = True):
        self.es, self.policy, self.make_env, self.config = es, policy, make_env, config
        self.timers, self.progress = timers, progress
        self.system_prompt: str | None = None  # the prompt program's current rendering (None: config/env's)

    def evaluate(self, members: Sequence[Member], sigma: float, task_seeds: list[int], rollout_seed: int
                 ) -> list[MemberResult]:
        c = self.config
        results = []
        bar = progress_bar(len(members), "members", leave=False) if self.progress else None
        for m in members:
            results.append(run_member(self.es, self.policy, c, self.make_env, m, sigma, task_seeds, rollout_seed,
                                      self.system_prompt, self.timers))
            if bar:
                bar.update(1)
        if bar:
            bar.close()
        return results

    def sync(self, record: dict) -> None:
        """Nothing to do: this evaluator shares the model `ES.tell` just updated."""


class BatchedEvaluator:
    """All members' episodes in one batched rollout (low-rank noise): the base weights stay untouched and
    every batch row adds its own member's low-rank term (`esopt.es.batched`). Member i runs rows
    [i*E, (i+1)*E). Greedy decoding gives each member exactly the episodes the sequential evaluator would;
    sampled decoding draws from other random streams (the batch is larger)."""

    def __init__(self, es: ES, policy: HFPolicy, make_env: Callable, config: ESTrainConfig, timers: Timers):
        from esopt.es.batched import BatchedLowRank

        self.host = BatchedLowRank(policy.model, es.perturbation)
        self.policy, self.make_env, self.config, self.timers = policy, make_env, config, timers
        self.system_prompt: str | None = None

    def evaluate(self, members: Sequence[Member], sigma: float, task_seeds: list[int], rollout_seed: int
                 ) -> list[MemberResult]:
        c, e, policy = self.config, len(task_seeds), self.policy

        def on_batch(rows: list[int]) -> None:  # row -> member; the shared prefix is encoded once per member
            policy.row_groups = [i // e for i in rows]
            self.host.set_rows(policy.row_groups)

        t0 = time.perf_counter()
        policy.on_rows = self.host.set_rows
        try:
            with self.host.members(members, sigma):
                t1 = time.perf_counter()
                trajectories, _ = rollout(policy, c, self.make_env, task_seeds * len(members), seed=rollout_seed,
                                          on_batch=on_batch, system_prompt=self.system_prompt)
                t2 = time.perf_counter()
        finally:
            policy.row_groups, policy.on_rows = None, None
        self.timers.perturb += t1 - t0
        self.timers.rollout += t2 - t1
        results = []
        for i, m in enumerate(members):
            own = trajectories[i * e:(i + 1) * e]
            stats = RolloutStats(episodes=e, generated_tokens=sum(t.generated_tokens for t in own))
            results.append(MemberResult(m.index, member_score(own, c.es.reward), own, stats))
        return results

    def sync(self, record: dict) -> None:
        """Nothing to do: the shared model was updated by `ES.tell`."""


class ESAlgorithm:
    """One ES generation per step, for `loop.train`."""

    unit = "generation"

    def __init__(self, policy: HFPolicy, config: ESTrainConfig, rd: RunDir, make_env: Callable, timers: Timers,
                 start: int, progress: bool):
        self.policy, self.config, self.timers = policy, config, timers
        self.es = ES(policy.model, config.strategy, ledger=rd.history_path, generation=start,
                     on_weights_changed=policy.weights_changed)
        self.evaluator: PopulationEvaluator
        if config.distributed.backend == "ray":
            from esopt.train.distributed import RayEvaluator

            records = read_history(rd.history_path)[:start] if rd.history_path.exists() else []
            self.evaluator = RayEvaluator(config, policy.model, records, rd.root, log=lambda m: say(m, progress))
        elif config.es.batched:
            self.evaluator = BatchedEvaluator(self.es, policy, make_env, config, timers)
        else:
            self.evaluator = LocalEvaluator(self.es, policy, make_env, config, timers, progress)
        self.make_env, self.progress = make_env, progress
        self.prompts = PromptStore(rd.root)
        self.program = self._current_prompt(start) if config.prompt.every else None
        if self.program is not None:
            self.evaluator.system_prompt = self.program.render()

    @property
    def steps_done(self) -> int:
        return self.es.generation

    def step(self, gen: int) -> dict:
        config = self.config
        members = self.es.ask(gen)
        tasks = generation_tasks(config, gen)
        rollout_seed = int(np.random.default_rng([config.seed, gen, 3]).integers(2**31))
        results = self.evaluator.evaluate(members, self.es.sigma, tasks, rollout_seed)
        rewards = np.array([r.reward for r in results])
        fitness = population_fitness(results, config)
        t_up = time.perf_counter()
        extra = {"prompt_version": self.program.version} if self.program is not None else None
        with defer_sigint():  # the update and its ledger line happen together or not at all
            told = self.es.tell(fitness, extra)
        self.evaluator.sync(self.es.last_record)
        self.timers.update += time.perf_counter() - t_up
        pop = summarize([t for r in results for t in r.trajectories])
        row = {
            "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max()),
            "reward_min": float(rewards.min()), "reward_std": float(rewards.std()),
            "success_rate": pop["success_rate"], "mean_turns": pop["mean_turns"],
            "sigma": told.sigma, "alpha": told.alpha, "update_rms": told.update_rms,
            "zero_variance": told.zero_variance,
            "valid_action_rate": pop["valid_action_rate"], "correct_given_valid": pop["correct_given_valid"],
            "generated_tokens": sum(r.stats.generated_tokens for r in results),
        }
        if config.es.antithetic:  # share of pairs whose two members scored differently
            row["pair_disagreement"] = pair_disagreement(fitness, [m.sign for m in members])
        if self.program is not None:
            row["prompt_version"] = self.program.version
            if (gen + 1) % config.prompt.every == 0:
                row.update(self.prompt_step(gen + 1, results))
        return row

    # --- prompt co-evolution ------------------------------------------------------------------------

    def _current_prompt(self, start: int) -> PromptVersion:
        """Version 0 is the config's (or env's) system prompt; on resume, the newest accepted version made
        at or before the resumed generation."""
        accepted = [v for v in self.prompts.all() if v.accepted and v.generation <= start]
        if accepted:
            return accepted[-1]
        with self.make_env() as env:
            system = resolve_system_prompt(env, self.config.env.system_prompt) or ""
        v0 = PromptVersion(0, system, [], generation=0)
        self.prompts.save(v0)
        return v0

    def _reflector(self):
        from esopt.prompt.reflector import HTTPReflector, PolicyReflector

        p = self.config.prompt
        if p.reflector == "http":
            return HTTPReflector(p.base_url, p.model, p.api_key_env, p.timeout_s, p.retries,
                                 log=lambda m: say(m, self.progress))
        return PolicyReflector(self.policy, p.max_new_tokens)

    def prompt_score(self, system_prompt: str, generation: int) -> float:
        """Mean score of the unperturbed policy on the gate's tasks with this system prompt."""
        c = self.config
        tasks = train_task_seeds(c.seed, 10**6 + generation, c.prompt.gate_tasks)  # not this generation's tasks
        trajectories, _ = rollout(self.policy, c, self.make_env, tasks, seed=generation, system_prompt=system_prompt)
        return member_score(trajectories, c.es.reward)

    def prompt_step(self, generation: int, results: Sequence[MemberResult]) -> dict:
        """Distil skills from this generation's trajectories, gate the candidate, keep the winner."""
        from esopt.prompt.skills import distill, feedback_lessons, gate

        c = self.config
        episodes = sorted(((trajectory_score(t, c.es.reward), t) for r in results for t in r.trajectories),
                          key=lambda x: x[0])
        if c.prompt.reflector == "feedback":  # every trajectory of the generation: counting is cheap
            skills = feedback_lessons([t for _, t in episodes], self.program.skills, c.prompt.max_skills)
            if skills is None:
                say("prompt step: no failing turn had feedback; the current prompt stays", self.progress)
        else:  # the reflector reads the k/2 worst and k/2 best episodes
            k = c.prompt.episodes
            picked = episodes[: (k + 1) // 2] + episodes[len(episodes) - k // 2:] if len(episodes) > k else episodes
            skills = distill(self._reflector(), self.program.system, [t for _, t in picked],
                             [s for s, _ in picked], self.program.skills, c.prompt.max_skills,
                             log=lambda m: say(m, self.progress))
        if skills is None:
            return {"prompt_accepted": False}
        if skills == self.program.skills:
            say("prompt step: the distilled skills equal the current ones; nothing to gate", self.progress)
            return {"prompt_accepted": False}
        candidate = PromptVersion(max(v.version for v in self.prompts.all()) + 1, self.program.system, skills,
                                  generation=generation)
        accepted, now, new = gate(lambda text: self.prompt_score(text, generation), self.program.render(),
                                  candidate.render(), c.prompt.margin)
        candidate.score, candidate.accepted = new, accepted
        self.prompts.save(candidate)
        say(f"prompt step @ {generation}: v{candidate.version} scores {new:.3f} vs v{self.program.version} {now:.3f}"
            f" -> {'accepted' if accepted else 'rejected'}", self.progress)
        if accepted:
            self.program = candidate
            self.evaluator.system_prompt = candidate.render()
        return {"prompt_accepted": accepted, "prompt_score": new, "prompt_score_before": now}

    def final_files(self) -> dict:
        """The prompt ships next to the weights (`esopt serve` reads it)."""
        if self.program is None:
            return {}
        return {"prompt.json": json.dumps({"system": self.program.render(), "version": self.program.version})}

    def describe(self, row: dict) -> str:
        line = f" | sigma {row['sigma']:.2e} alpha {row['alpha']:.2e}"
        if "pair_disagreement" in row:
            line += f" | pairs differ {row['pair_disagreement']:.2f}"
        return line

    def checkpoint_files(self) -> dict:
        return self.final_files()

    def close(self) -> None:
        close = getattr(self.evaluator, "close", None)
        if close is not None:
            close()

    def time_note(self, timers: Timers) -> str:
        return f"ES overhead share {timers.es_overhead_share:.1%}"


def resume_weights(rd: RunDir, config: ESTrainConfig) -> tuple[HFPolicy, int]:
    """Weights after the last complete generation: newest checkpoint + replay of the ledger tail."""
    records = read_history(rd.history_path) if rd.history_path.exists() else []
    Ledger(rd.history_path).truncate(len(records))  # drop a torn line for good
    ckpt = rd.latest_checkpoint(at_most=len(records))
    if ckpt and config.model.resolved_dtype == "float32":  # checkpoints hold the exact fp32 master weights
        step, path = ckpt
        policy = load_policy(str(path), dtype=config.model.resolved_dtype, device=config.model.device)
    else:
        step, policy = 0, load_model(config.model, config.env.kwargs)
    replay(policy.model, records[step:])
    rd.drop_metrics_from(len(records))
    return policy, len(records)


def setup(rd: RunDir, config: ESTrainConfig, make_env: Callable, timers: Timers, resume: bool, progress: bool
          ) -> tuple[ESAlgorithm, int]:
    policy, start = resume_weights(rd, config) if resume else (load_model(config.model, config.env.kwargs), 0)
    return ESAlgorithm(policy, config, rd, make_env, timers, start, progress), start


def train(config: ESTrainConfig, out: str | Path, resume: bool = False, progress: bool = True) -> dict:
    return loop.train(config, out, setup, resume=resume, progress=progress)
