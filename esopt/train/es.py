"""ES fine-tuning of an LLM agent, top to bottom.

Per generation: ask G member seeds -> every member, perturbed in place, runs the same E tasks (common
random numbers) -> one scalar reward per member -> shaping -> theta += alpha/G sum w_i eps_i -> one
ledger line. The ledger (history.jsonl) is the source of truth: resume = last checkpoint + replay of
the generations after it, bit-exact in fp32, so a run killed at any moment continues as if never stopped.

Population evaluation sits behind `PopulationEvaluator` (member specs + tasks in, rewards and
trajectories out): `LocalEvaluator` perturbs the one local model; a Ray backend (replicas that sync by
ledger records) or a batched low-rank backend plugs in without touching this loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from esopt.es import ES, ESConfig, Ledger, Member, ParamScope, read_history, replay
from esopt.es.shaping import pair_disagreement, task_normalized
from esopt.policies import HFPolicy, load_policy
from esopt.rollout import RolloutStats, Trajectory
from esopt.train.common import (
    RunDir,
    Timers,
    env_factory,
    evaluate,
    finish,
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
from esopt.utils.memory import fmt_bytes, peak_memory_bytes
from esopt.utils.signals import defer_sigint


@dataclass
class MemberResult:
    index: int
    reward: float
    trajectories: list[Trajectory]
    stats: RolloutStats


class PopulationEvaluator(Protocol):
    def evaluate(self, members: Sequence[Member], task_seeds: list[int], rollout_seed: int) -> list[MemberResult]: ...


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


class LocalEvaluator:
    """Evaluates members one after another on the single local model, perturbed in place."""

    def __init__(self, es: ES, policy: HFPolicy, make_env: Callable, config: ESTrainConfig, timers: Timers,
                 progress: bool = True):
        self.es, self.policy, self.make_env, self.config = es, policy, make_env, config
        self.timers, self.progress = timers, progress

    def evaluate(self, members: Sequence[Member], task_seeds: list[int], rollout_seed: int) -> list[MemberResult]:
        c = self.config
        results = []
        bar = progress_bar(len(members), "members", leave=False) if self.progress else None
        for m in members:
            t0 = time.perf_counter()
            with self.es.perturbed(m):
                t1 = time.perf_counter()
                trajectories, stats = rollout(self.policy, c, self.make_env, task_seeds, seed=rollout_seed)
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            self.timers.perturb += t1 - t0
            self.timers.rollout += t2 - t1
            self.timers.restore += t3 - t2
            results.append(MemberResult(m.index, member_score(trajectories, c.es.reward), trajectories, stats))
            if bar:
                bar.update(1)
        if bar:
            bar.close()
        return results


def es_config(config: ESTrainConfig) -> ESConfig:
    e = config.es
    return ESConfig(
        population_size=e.population_size, antithetic=e.antithetic, sigma=e.sigma, sigma_min=e.sigma_min,
        sigma_schedule=e.sigma_schedule, alpha=e.alpha, alpha_min=e.alpha_min, alpha_schedule=e.alpha_schedule,
        total_generations=config.steps, shaping=e.shaping, weight_decay=e.weight_decay,
        scope=ParamScope(e.scope, e.scope_pattern), restore=e.restore, seed=config.seed)


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


def train(config: ESTrainConfig, out: str | Path, resume: bool = False, progress: bool = True) -> dict:
    rd = RunDir(out)
    if resume:
        policy, start = resume_weights(rd, config)
        say(f"resuming {rd.root} at generation {start}/{config.steps}", progress)
    else:
        if rd.history_path.exists() and rd.history_path.stat().st_size:
            raise FileExistsError(f"{rd.root} already holds a run: use --resume or another --out")
        rd.write_config(config)
        policy, start = load_model(config.model, config.env.kwargs), 0
    make_env = env_factory(config)
    es = ES(policy.model, es_config(config), ledger=rd.history_path, generation=start)
    timers = Timers()
    evaluator: PopulationEvaluator = LocalEvaluator(es, policy, make_env, config, timers, progress)

    def run_eval(step: int) -> dict:
        t = time.perf_counter()
        result = evaluate(policy, config, make_env)
        timers.eval += time.perf_counter() - t
        rd.log(step, "eval", result)
        return result

    evals = {r["step"]: r for r in rd.metrics() if r["kind"] == "eval"}
    if start not in evals:
        evals[start] = run_eval(start)
    say(f"eval @ {start}: success {evals[start]['success_rate']:.3f} reward {evals[start]['mean_reward']:.3f}", progress)
    t_start, interrupted, gen = time.perf_counter(), False, start
    bar = progress_bar(config.steps, "generations", initial=start) if progress else None
    try:
        for gen in range(start, config.steps):
            t_gen = time.perf_counter()
            members = es.ask(gen)
            tasks = generation_tasks(config, gen)
            rollout_seed = int(np.random.default_rng([config.seed, gen, 3]).integers(2**31))
            results = evaluator.evaluate(members, tasks, rollout_seed)
            rewards = np.array([r.reward for r in results])
            fitness = population_fitness(results, config)
            t_up = time.perf_counter()
            with defer_sigint():  # the update and its ledger line happen together or not at all
                told = es.tell(fitness)
            timers.update += time.perf_counter() - t_up
            pop = summarize([t for r in results for t in r.trajectories])
            row = {
                "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max()),
                "reward_min": float(rewards.min()), "reward_std": float(rewards.std()),
                "success_rate": pop["success_rate"], "mean_turns": pop["mean_turns"],
                "sigma": told.sigma, "alpha": told.alpha, "update_rms": told.update_rms,
                "zero_variance": told.zero_variance, "seconds": time.perf_counter() - t_gen,
                "valid_action_rate": pop["valid_action_rate"], "correct_given_valid": pop["correct_given_valid"],
                "generated_tokens": sum(r.stats.generated_tokens for r in results),
                "peak_memory_bytes": peak_memory_bytes(policy.device),
            }
            if config.es.antithetic:  # share of pairs whose two members scored differently
                row["pair_disagreement"] = pair_disagreement(fitness, [m.sign for m in members])
            del results  # the population's trajectories must not stay alive through the eval below
            rd.log(gen + 1, "train", row)
            done = gen + 1
            line = (f"gen {done}/{config.steps} | reward mean {row['reward_mean']:.3f} max {row['reward_max']:.3f}"
                    f" | sigma {told.sigma:.2e} alpha {told.alpha:.2e}")
            if "pair_disagreement" in row:
                line += f" | pairs differ {row['pair_disagreement']:.2f}"
            if (config.eval.every and done % config.eval.every == 0) or done == config.steps:
                evals[done] = run_eval(done)
                line += f" | eval success {evals[done]['success_rate']:.3f}"
            line += f" | {row['seconds']:.1f}s | peak {fmt_bytes(row['peak_memory_bytes'])}"
            say(line, progress)
            if done % config.checkpoint_every == 0 and done != config.steps:
                rd.save_checkpoint(policy, done, {"algo": "es"}, config.keep_checkpoints)
            if bar:
                bar.update(1)
    except KeyboardInterrupt:
        interrupted = True  # the perturbation context already restored the weights
        rd.save_checkpoint(policy, es.generation, {"algo": "es"}, config.keep_checkpoints)
        say(f"interrupted: saved generation {es.generation}; resume with `esopt train --resume {rd.root}`", progress)
    finally:
        if bar:
            bar.close()
    return finish(rd, policy, config, timers, evals, start, es.generation, time.perf_counter() - t_start,
                  interrupted, progress)
