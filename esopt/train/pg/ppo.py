"""Multi-turn PPO baseline with a separate critic, on the same rollouts, run dir and evals as ES.

Per step (CleanRL's order): roll out `tasks_per_step` tasks -> per-turn rewards (`reward`: the env's
own per-turn rewards, or the binary success / final shaped score placed on the last turn) -> the
critic's value of every turn (a copy of the initial model's backbone + a scalar head, read at the
last prompt token) -> GAE over the turns of each episode (the episode ends after its last turn:
the turn cap is part of the task and the observation shows the turns left) -> advantages normalized
over the batch (option) and broadcast to the turn's generated tokens -> `epochs` passes of minibatches
of clipped policy loss + vf_coef * clipped value loss (+ kl_beta * k3 KL to the initial model if
kl_beta > 0). Diagnostics as CleanRL: approx_kl, clipfrac, explained variance.

Memory: policy + critic (+ reference if kl_beta > 0) + AdamW moments of both, which is why PPO needs
several times the memory of ES (the paper: 89 GB vs 8 GB on a 4B model).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

from esopt.engines.base import Engine
from esopt.rollout import Trajectory
from esopt.train.config import PPOTrainConfig
from esopt.train.pg import (
    Norm,
    TokenBatch,
    batch_logprobs,
    collate,
    logprob_temperature,
    make_optimizer,
    micro_batches,
    optimize,
    policy_loss,
    prefix_once,
    shared_prefix_forward,
    shuffle_generator,
    token_logprobs,
    train_policy_gradient,
    turn_samples,
)
from esopt.train.tasks import train_task_seeds


def turn_rewards(traj: Trajectory, kind: str) -> list[float]:
    """Per-turn rewards: the env's ('env'), or the episode's success / final shaped score on the last turn."""
    if kind == "env" or not traj.turns:
        return [float(t.reward) for t in traj.turns]
    final = float(traj.success) if kind == "success" else float(traj.turns[-1].info.get("shaped_reward", 0.0))
    return [0.0] * (traj.num_turns - 1) + [final]


def gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) of one episode; the value after the last turn is 0 (the episode is over).

    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1};  R_t = A_t + V_t.
    """
    n = len(rewards)
    adv = np.zeros(n)
    next_value, running = 0.0, 0.0
    for t in reversed(range(n)):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t], next_value = running, values[t]
    return adv, adv + np.asarray(values, dtype=np.float64)


def explained_variance(pred: np.ndarray, target: np.ndarray) -> float | None:
    """1 - Var(target - pred) / Var(target); None when the targets have no variance."""
    var = float(np.var(target))
    return None if var == 0 else 1.0 - float(np.var(target - pred)) / var


class Critic(torch.nn.Module):
    """A copy of the initial model's backbone + a zero-initialised scalar head (values start at 0)."""

    def __init__(self, backbone: torch.nn.Module, hidden: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.head.to(next(backbone.parameters()).device)

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> Critic:
        return cls(copy.deepcopy(model.base_model).eval(), model.config.hidden_size)

    def forward(self, batch: TokenBatch) -> torch.Tensor:
        """(N,) value of each sample at its last prompt token (the response is not read)."""
        width = int(batch.prompt_last.max()) + 1
        out, shared = shared_prefix_forward(self.backbone, batch.input_ids[:, :width],
                                            batch.attention_mask[:, :width], int(batch.prompt_last.min()))
        hidden = out.last_hidden_state  # (N, W - shared, H)
        last = hidden[torch.arange(len(batch), device=hidden.device), batch.prompt_last - shared]  # (N, H)
        return self.head(last.float()).squeeze(-1)


class PPO:
    """The PPO algorithm plugged into `train_policy_gradient`: policy, critic, one AdamW with a group for each."""

    def __init__(self, policy: Engine, ref: torch.nn.Module | None, config: PPOTrainConfig) -> None:
        self.policy, self.ref, self.config, self.section = policy, ref, config, config.ppo
        self.temperature = logprob_temperature(config)
        self.critic = Critic.from_model(policy.model)
        s = self.section
        self.optimizer = make_optimizer([("policy", list(policy.model.parameters()), s.lr),
                                         ("value", list(self.critic.parameters()), s.critic_lr)], s)

    def task_seeds(self, step: int) -> list[int]:
        return train_task_seeds(self.config.seed, step, self.section.tasks_per_step)

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        out = torch.zeros(len(batch), device=batch.advantages.device)
        with prefix_once([self.critic.backbone], batch):
            for idx in micro_batches(len(batch), self.section.micro_batch_size):
                idx = idx.to(out.device)
                out[idx] = self.critic(batch.select(idx))
        return out

    def prepare(self, trajectories: list[Trajectory]) -> TokenBatch:
        """All turns (empty generations too: they carry no policy gradient but fit the value)."""
        s = self.section
        samples = turn_samples(trajectories, [[0.0] * t.num_turns for t in trajectories], keep_empty=True)
        batch = collate(samples, self.policy.tokenizer.pad_token_id, self.policy.device)
        if len(batch) == 0:
            return batch
        batch.old_values = self.values(batch)
        values, adv, ret, lo = batch.old_values.cpu().numpy(), [], [], 0
        for traj in trajectories:  # samples are in (trajectory, turn) order
            a, r = gae(turn_rewards(traj, s.reward), values[lo: lo + traj.num_turns].tolist(), s.gamma, s.lam)
            adv.append(a)
            ret.append(r)
            lo += traj.num_turns
        advantages = torch.tensor(np.concatenate(adv), dtype=torch.float32, device=batch.advantages.device)
        batch.returns = torch.tensor(np.concatenate(ret), dtype=torch.float32, device=batch.returns.device)
        if s.norm_adv:
            used = advantages[batch.mask.sum(1) > 0]
            if len(used) > 1:
                advantages = (advantages - used.mean()) / (used.std(unbiased=False) + 1e-8)
        batch.advantages = advantages
        batch.old_logprobs = batch_logprobs(self.policy.model, batch, self.temperature, s.micro_batch_size)
        if self.ref is not None:
            batch.ref_logprobs = batch_logprobs(self.ref, batch, self.temperature, s.micro_batch_size)
        return batch

    def loss(self, batch: TokenBatch, norm: Norm):
        s = self.section
        loss, stats = policy_loss(token_logprobs(self.policy.model, batch, self.temperature), batch, s, norm)
        v = self.critic(batch)
        err = (v - batch.returns) ** 2
        if s.value_clip > 0:
            clipped = batch.old_values + torch.clamp(v - batch.old_values, -s.value_clip, s.value_clip)
            err = torch.maximum(err, (clipped - batch.returns) ** 2)
        value_loss = 0.5 * err.sum() / norm.samples
        stats["value_loss"] = (float(0.5 * err.detach().sum()), float(len(batch)))
        return loss + s.vf_coef * value_loss, stats

    def update(self, trajectories: list[Trajectory], step: int) -> dict[str, float]:
        batch = self.prepare(trajectories)
        if len(batch) == 0:
            return {"loss": 0.0, "grad_norm": 0.0, "samples": 0}
        diag = {"samples": len(batch), "value_mean": float(batch.old_values.mean()),
                "return_mean": float(batch.returns.mean()),
                "explained_variance": explained_variance(batch.old_values.cpu().numpy(), batch.returns.cpu().numpy())}
        gen = shuffle_generator(self.config.seed, step)
        models = [self.policy.model, self.critic.backbone]
        return {**optimize(batch, self.loss, self.optimizer, self.section, gen, models), **diag}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "critic": self.critic.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])


def train(config: PPOTrainConfig, out: str | Path, resume: bool = False, progress: bool = True) -> dict:
    return train_policy_gradient(config, out, PPO, resume=resume, progress=progress)
