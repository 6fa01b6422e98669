"""ES fine-tuning of an LLM agent, top to bottom (the loop around it is `loop.py`, shared with GRPO/PPO).

Per generation: ask G member seeds -> an evaluator runs every member, perturbed, on the same E tasks
(common random numbers) -> one scalar reward per member -> shaping -> theta += alpha/G sum w_i eps_i ->
one ledger line. The ledger (history.jsonl) is the source of truth: resume = last checkpoint + replay of
the generations after it, bit-exact in fp32, so a run killed at any moment continues as if never stopped.

Where members run is a population evaluator (`esopt.population`: local, batched, ray, chosen by name);
the optional prompt half of co-evolution is `coevolution.PromptEvolution`.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from esopt.engines.base import Engine
from esopt.es import ES, Ledger, read_history
from esopt.es.shaping import ZeroVariancePopulation, pair_disagreement, task_normalized
from esopt.models import load_policy
from esopt.population import Evaluator, MemberResult, PopulationContext, ReplicaParts, build_evaluator
from esopt.rollout import summarize, trajectory_score
from esopt.train import loop
from esopt.train.config import ESTrainConfig, build_config
from esopt.train.evaluate import member_spec, rollout_spec
from esopt.train.models import load_model
from esopt.train.rundir import RunDir
from esopt.train.tasks import env_factory, task_pool_seeds, train_task_seeds
from esopt.utils.progress import say
from esopt.utils.signals import defer_sigint
from esopt.utils.timers import Timers


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


def replica_setup(config_data: dict) -> ReplicaParts:
    """Run in a remote worker: the run's model (base weights) and envs, from the config alone."""
    config = build_config(config_data)
    return ReplicaParts(config.es_config, load_model(config.model, config.env.kwargs), env_factory(config),
                        config.es.reward)


def population_evaluator(
    config: ESTrainConfig,
    es: ES,
    policy: Engine,
    make_env: Callable,
    timers: Timers | None = None,
    progress: bool = False,
    run_dir: Path | None = None,
    records: Sequence[dict] = (),
    log: Callable[[str], None] | None = None,
) -> Evaluator:
    """The run's population evaluator (`config.population_evaluator`, from the registry) over `policy`."""
    context = PopulationContext(
        es, policy, make_env, config.es.reward, timers or Timers(), progress, log=log or (lambda m: say(m, progress)),
        replica_setup=functools.partial(replica_setup, config.model_dump(mode="json")), records=list(records),
        run_dir=run_dir, distributed=config.distributed, members_per_rollout=config.es.members_per_rollout)
    return build_evaluator(config.population_evaluator, context)


class ESAlgorithm:
    """One ES generation per step, for `loop.train`."""

    unit = "generation"

    def __init__(self, policy: Engine, config: ESTrainConfig, rd: RunDir, make_env: Callable, timers: Timers,
                 start: int, progress: bool, applied: int | None = None):
        """`policy` holds the weights after generation `applied` (default `start`): the ledger lines from there
        to `start` are applied here, through the ES's own perturbation (a stateful optimiser's moments too)."""
        self.policy, self.config, self.timers = policy, config, timers
        records = read_history(rd.history_path)[:start] if rd.history_path.exists() else []
        es_config = config.es_config
        if records and records[0]["restore"] != es_config.restore:  # replay reads the first line's mode: keep it
            es_config = es_config.model_copy(update={"restore": records[0]["restore"]})
        applied = start if applied is None else applied
        self.es = ES(policy.model, es_config, ledger=rd.history_path, generation=applied,
                     on_weights_changed=policy.weights_changed)
        self.es.fast_forward(records[applied:start])
        self.spec = rollout_spec(config, make_env)
        self.evaluator = population_evaluator(config, self.es, policy, make_env, timers, progress, rd.root, records)
        self.prompts = None
        if config.prompt.every:
            from esopt.train.coevolution import PromptEvolution

            self.prompts = PromptEvolution(policy, config, rd, make_env, self.spec, start, progress)
            self.spec = self.prompts.spec

    @property
    def steps_done(self) -> int:
        return self.es.generation

    def step(self, gen: int) -> dict:
        config = self.config
        members = self.es.ask(gen)
        tasks = generation_tasks(config, gen)
        rollout_seed = int(np.random.default_rng([config.seed, gen, 3]).integers(2**31))
        results = self.evaluator.evaluate(members, self.es.sigma, tasks, rollout_seed, member_spec(self.spec, config))
        rewards = np.array([r.reward for r in results])
        fitness = population_fitness(results, config)
        t_up = time.perf_counter()
        extra = {"prompt_version": self.prompts.program.version} if self.prompts is not None else None
        with defer_sigint(), warnings.catch_warnings():  # the update and its ledger line: together or not at all
            warnings.simplefilter("ignore", ZeroVariancePopulation)  # said in the generation's line instead
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
            "prompt_tokens": sum(r.stats.prompt_tokens for r in results),
        }
        if config.es.antithetic:  # share of pairs whose two members scored differently
            row["pair_disagreement"] = pair_disagreement(fitness, [m.sign for m in members])
        if self.prompts is not None:
            row["prompt_version"] = self.prompts.program.version
            if (gen + 1) % config.prompt.every == 0:
                row.update(self.prompts.step(gen + 1, results))
                self.spec = self.prompts.spec
        return row

    def final_files(self) -> dict:
        """The prompt ships next to the weights (`esopt serve` reads it)."""
        return self.prompts.files() if self.prompts is not None else {}

    def describe(self, row: dict) -> str:
        line = f" | sigma {row['sigma']:.2e} alpha {row['alpha']:.2e}"
        if "pair_disagreement" in row:
            line += f" | pairs differ {row['pair_disagreement']:.2f}"
        if row["zero_variance"]:
            line += " | zero update: all rewards equal"
        return line

    def checkpoint_files(self) -> dict:
        return self.final_files()

    def close(self) -> None:
        self.evaluator.close()

    def time_shares(self, timers: Timers) -> dict[str, float]:
        return {"es_overhead_share": timers.es_overhead_share}

    def time_note(self, timers: Timers) -> str:
        return f"ES overhead share {timers.es_overhead_share:.1%}"


def resume_weights(rd: RunDir, config: ESTrainConfig) -> tuple[Engine, int, int]:
    """(policy, generations in the ledger, generation the policy's weights are at): the newest checkpoint, or
    the base model when there is none (a run dir whose weights are gone: the ledger rebuilds them exactly),
    when the weights are not fp32 (a checkpoint holds rounded weights, the ledger the exact fp32 ones) or
    when the optimiser has state a checkpoint does not hold (Adam: its moments are rebuilt from every line).
    The lines after it are applied by `ESAlgorithm`."""
    records = read_history(rd.history_path) if rd.history_path.exists() else []
    Ledger(rd.history_path).truncate(len(records))  # drop a torn line for good
    ckpt = rd.latest_checkpoint(at_most=len(records))
    if ckpt and config.model.resolved_dtype == "float32" and config.es.optimizer == "sgd":
        step, path = ckpt
        policy = load_policy(str(path), dtype=config.model.resolved_dtype, device=config.model.device,
                             engine=config.model.engine)
    else:
        step, policy = 0, load_model(config.model, config.env.kwargs)
    rd.drop_metrics_from(len(records))
    return policy, len(records), step


def setup(rd: RunDir, config: ESTrainConfig, make_env: Callable, timers: Timers, resume: bool, progress: bool
          ) -> tuple[ESAlgorithm, int]:
    if resume:
        policy, start, applied = resume_weights(rd, config)
        if start and not applied:
            say(f"rebuilding the weights of generation {start} from the base model and the ledger", progress)
    else:
        policy, start, applied = load_model(config.model, config.env.kwargs), 0, 0
    return ESAlgorithm(policy, config, rd, make_env, timers, start, progress, applied), start


def train(config: ESTrainConfig, out: str | Path, resume: bool = False, progress: bool = True) -> dict:
    return loop.train(config, out, setup, resume=resume, progress=progress)
