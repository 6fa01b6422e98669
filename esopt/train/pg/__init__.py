"""What the policy-gradient baselines (GRPO, PPO) share, on the same rollouts, run dir and evals as ES.

Data flow of one step: `run_episodes` -> per-turn samples (prompt ids + the policy's own generated ids,
never re-tokenized) -> right-padded `TokenBatch` whose `mask` is 1 only on generated tokens -> old
log-probs from a no-grad forward of the current model (and reference log-probs for the KL term) ->
`optimize`: epochs of shuffled minibatches, gradient accumulation over micro-batches, per-group
gradient clipping, AdamW. `PolicyGradient` is the step both trainers run in the shared loop (`loop.py`);
an algorithm only says which tasks to roll out, how to turn trajectories into a loss, and what extra state
it checkpoints.

Log-probs are taken under log_softmax(logits / T) with the run's sampling temperature T (1 when
greedy); top-k/top-p truncation is not applied (the usual convention of PPO/GRPO implementations).
The model stays in eval mode while training (dropout off), so a fresh ratio is exactly 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from esopt.engines.base import Engine
from esopt.models import load_policy
from esopt.rollout import Trajectory, summarize, trajectory_score
from esopt.train import loop
from esopt.train.config import BaseTrainConfig, PGSection
from esopt.train.evaluate import rollout_spec
from esopt.train.models import load_model
from esopt.train.pg.batch import TokenBatch, TurnSample, collate, turn_samples
from esopt.train.pg.loss import (
    Norm,
    aggregate,
    batch_logprobs,
    kl_k3,
    masked_sum,
    micro_batches,
    minibatch_norm,
    policy_loss,
    prefix_once,
    shared_prefix_forward,
    token_logprobs,
)
from esopt.train.pg.optimize import (
    LossFn,
    MasterAdamW,
    freeze,
    frozen_copy,
    lr_factor,
    make_optimizer,
    optimize,
    shuffle_generator,
)
from esopt.train.rundir import RunDir
from esopt.utils.signals import defer_sigint
from esopt.utils.timers import Timers

STATE_FILE = "pg_state.pt"  # optimizer (+ critic) state inside a checkpoint dir

__all__ = ["STATE_FILE", "LossFn", "MasterAdamW", "Norm", "PGSection", "PolicyGradient", "TokenBatch", "TurnSample",
           "aggregate", "batch_logprobs", "collate", "episode_scores", "freeze", "frozen_copy", "kl_k3",
           "latest_pg_checkpoint", "load_state", "logprob_temperature", "lr_factor", "make_optimizer", "masked_sum",
           "micro_batches", "minibatch_norm", "optimize", "pg_section", "policy_loss", "prefix_once",
           "shared_prefix_forward", "shuffle_generator", "token_logprobs", "train_policy_gradient", "turn_samples"]


def pg_section(config: BaseTrainConfig) -> PGSection:
    return getattr(config, config.algo)


def logprob_temperature(config: BaseTrainConfig) -> float:
    return config.sampling.temperature or 1.0


def episode_scores(trajectories: list[Trajectory], kind: str) -> np.ndarray:
    """One score per episode, defined exactly as ES's member score of a single-episode member."""
    return np.array([trajectory_score(t, kind) for t in trajectories], dtype=np.float64)


def latest_pg_checkpoint(rd: RunDir) -> tuple[int, Path] | None:
    found = rd.latest_checkpoint()
    while found and not (found[1] / STATE_FILE).exists():  # never resume from a checkpoint missing its state
        found = rd.latest_checkpoint(at_most=found[0] - 1)
    return found


def load_state(path: Path, device: torch.device | str) -> dict:
    return torch.load(path / STATE_FILE, map_location=device, weights_only=True)


class PGAlgorithm(Protocol):
    """What GRPO and PPO implement: which tasks to roll out, and the update from the trajectories."""

    optimizer: MasterAdamW

    def task_seeds(self, step: int) -> list[int]: ...

    def update(self, trajectories: list[Trajectory], step: int) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


Builder = Callable[[Engine, "torch.nn.Module | None", BaseTrainConfig], PGAlgorithm]


def step_row(trajectories: list[Trajectory], kind: str) -> dict[str, float]:
    scores = episode_scores(trajectories, kind) if trajectories else np.zeros(1)
    pop = summarize(trajectories)
    return {"reward_mean": float(scores.mean()), "reward_max": float(scores.max()),
            "reward_min": float(scores.min()), "reward_std": float(scores.std()),
            "success_rate": pop["success_rate"], "mean_turns": pop["mean_turns"]}


class PolicyGradient:
    """A GRPO or PPO step for `loop.train`: roll out the algorithm's tasks, then its update."""

    unit = "step"

    def __init__(self, algo: PGAlgorithm, policy: Engine, config: BaseTrainConfig, make_env: Callable,
                 timers: Timers, start: int):
        self.algo, self.policy, self.config, self.make_env, self.timers = algo, policy, config, make_env, timers
        self.spec = rollout_spec(config, make_env)
        self.steps_done = start

    def step(self, step: int) -> dict:
        config, t_step = self.config, time.perf_counter()
        rollout_seed = int(np.random.default_rng([config.seed, step, 3]).integers(2**31))
        trajectories, stats = self.spec.run(self.policy, self.make_env, self.algo.task_seeds(step), seed=rollout_seed)
        t_up = time.perf_counter()
        self.timers.rollout += t_up - t_step
        lr_scale = lr_factor(pg_section(config).lr_schedule, step, config.steps)
        self.algo.optimizer.scale_lr(lr_scale)
        with defer_sigint():  # a step's updates happen completely or not at all
            upd = self.algo.update(trajectories, step)
            self.steps_done = step + 1
        self.policy.weights_changed()
        self.timers.update += time.perf_counter() - t_up
        return {**step_row(trajectories, pg_section(config).reward), "kl": None, "lr_scale": lr_scale, **upd,
                "generated_tokens": stats.generated_tokens, "prompt_tokens": stats.prompt_tokens,
                "rollout_seconds": t_up - t_step,
                "update_seconds": time.perf_counter() - t_up}

    def describe(self, row: dict) -> str:
        kl = "n/a" if row["kl"] is None else format(row["kl"], ".2e")
        return f" | loss {row['loss']:.4f} kl {kl} clipfrac {row.get('clipfrac', 0.0):.3f}"

    def final_files(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def checkpoint_files(self) -> dict:
        state = self.algo.state_dict()
        return {STATE_FILE: lambda path: torch.save(state, path)}

    def time_shares(self, timers: Timers) -> dict[str, float]:
        return {"update_share": timers.update / max(timers.update + timers.rollout, 1e-9)}

    def time_note(self, timers: Timers) -> str:
        return f"update share {self.time_shares(timers)['update_share']:.1%}"


def pg_setup(build: Builder):
    """The `loop.Setup` of a policy-gradient algorithm: weights, frozen reference and optimizer state from
    the newest checkpoint that has its state file (or the initial model)."""

    def setup(rd: RunDir, config: BaseTrainConfig, make_env: Callable, timers: Timers, resume: bool,
              progress: bool) -> tuple[PolicyGradient, int]:
        found = latest_pg_checkpoint(rd) if resume else None
        if resume:
            rd.drop_metrics_from(found[0] if found else 0)
        need_ref = pg_section(config).kl_beta > 0
        if found:
            start, path = found
            policy = load_policy(str(path), dtype=config.model.resolved_dtype, device=config.model.device,
                                 engine=config.model.engine)
            ref = freeze(load_model(config.model, config.env.kwargs).model) if need_ref else None  # initial weights
        else:
            start, policy = 0, load_model(config.model, config.env.kwargs)
            ref = frozen_copy(policy.model) if need_ref else None
        algo = build(policy, ref, config)
        if found:
            algo.load_state_dict(load_state(found[1], config.model.device))
        return PolicyGradient(algo, policy, config, make_env, timers, start), start

    return setup


def train_policy_gradient(config: BaseTrainConfig, out: str | Path, build: Builder, resume: bool = False,
               progress: bool = True) -> dict:
    return loop.train(config, out, pg_setup(build), resume=resume, progress=progress)
