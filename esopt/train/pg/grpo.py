"""Multi-turn GRPO baseline (the paper's setting), on the same rollouts, run dir and evals as ES.

Per step: `tasks_per_step` training tasks, each rolled out `group_size` times (independent sampling
streams) -> one score per episode (`reward`: env | success | shaped, as ES's member score) -> z-score
within each task's group (std with ddof 0; a group whose scores are all equal gets advantage 0) ->
the episode's advantage is broadcast to every turn, and every turn is its own (prompt, response)
sample -> old log-probs by a no-grad forward of the current model -> clipped surrogate + kl_beta * k3
KL to a frozen copy of the initial model -> AdamW over `epochs` passes of minibatches.

Paper defaults: group 8, lr 1e-6, KL 1e-3, clip 0.2; 128 tasks x 8 = 1024 episodes per step, the same
episode budget as one ES generation (population 32 x 32 tasks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from esopt.engines.base import Engine
from esopt.rollout import Trajectory
from esopt.train.config import GRPOTrainConfig
from esopt.train.pg import (
    Norm,
    TokenBatch,
    batch_logprobs,
    collate,
    episode_scores,
    logprob_temperature,
    make_optimizer,
    optimize,
    policy_loss,
    shuffle_generator,
    token_logprobs,
    train_policy_gradient,
    turn_samples,
)
from esopt.train.tasks import train_task_seeds


def group_advantages(scores: np.ndarray, group_size: int, eps: float = 1e-8) -> np.ndarray:
    """Z-score of each score within consecutive groups of `group_size` (ddof 0).

    A group with (numerically) zero spread gets advantage 0, never NaN or a blown-up rounding error.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size % group_size:
        raise ValueError(f"{scores.size} scores do not split into groups of {group_size}")
    g = scores.reshape(-1, group_size)
    mean, std = g.mean(1, keepdims=True), g.std(1, keepdims=True)
    adv = np.where(std > eps, (g - mean) / (std + eps), 0.0)
    return adv.reshape(-1)


def grpo_samples(trajectories: list[Trajectory], group_size: int, reward: str, eps: float = 1e-8):
    """(samples, episode advantages): each turn a sample carrying its episode's group advantage."""
    adv = group_advantages(episode_scores(trajectories, reward), group_size, eps)
    return turn_samples(trajectories, [[a] * t.num_turns for a, t in zip(adv, trajectories)]), adv


class GRPO:
    """The GRPO algorithm plugged into `train_policy_gradient`: the policy, its optimizer, the frozen reference."""

    def __init__(self, policy: Engine, ref: torch.nn.Module | None, config: GRPOTrainConfig) -> None:
        self.policy, self.ref, self.config, self.section = policy, ref, config, config.grpo
        self.temperature = logprob_temperature(config)
        self.optimizer = make_optimizer([("policy", list(policy.model.parameters()), self.section.lr)], self.section)

    def task_seeds(self, step: int) -> list[int]:
        tasks = train_task_seeds(self.config.seed, step, self.section.tasks_per_step)
        return [s for s in tasks for _ in range(self.section.group_size)]  # group i = episodes [i*g, (i+1)*g)

    def prepare(self, trajectories: list[Trajectory]) -> tuple[TokenBatch, np.ndarray]:
        s = self.section
        samples, adv = grpo_samples(trajectories, s.group_size, s.reward, s.adv_eps)
        batch = collate(samples, self.policy.tokenizer.pad_token_id, self.policy.device)
        if s.epochs > 1 or len(batch) > s.minibatch_size:  # else one optimizer step at the rollout's weights:
            # the ratio is exactly 1 there, and `policy_loss` takes the old log-probs from the graph (one pass less)
            batch.old_logprobs = batch_logprobs(self.policy.model, batch, self.temperature, s.micro_batch_size)
        if self.ref is not None:
            batch.ref_logprobs = batch_logprobs(self.ref, batch, self.temperature, s.micro_batch_size)
        return batch, adv

    def loss(self, batch: TokenBatch, norm: Norm):
        return policy_loss(token_logprobs(self.policy.model, batch, self.temperature), batch, self.section, norm)

    def update(self, trajectories: list[Trajectory], step: int) -> dict[str, float]:
        batch, adv = self.prepare(trajectories)
        stats = {"samples": len(batch), "zero_adv_groups": int((np.abs(adv.reshape(-1, self.section.group_size))
                                                                  .max(1) == 0).sum())}
        if len(batch) == 0:
            return {"loss": 0.0, "grad_norm": 0.0, **stats}
        gen = shuffle_generator(self.config.seed, step)
        return {**optimize(batch, self.loss, self.optimizer, self.section, gen, [self.policy.model]), **stats}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


def train(config: GRPOTrainConfig, out: str | Path, resume: bool = False, progress: bool = True) -> dict:
    return train_policy_gradient(config, out, GRPO, resume=resume, progress=progress)
