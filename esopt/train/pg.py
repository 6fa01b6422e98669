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

import copy
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch
from pydantic import Field, model_validator

from esopt.policies import HFPolicy, load_policy
from esopt.rollout import Trajectory
from esopt.train import loop
from esopt.train.common import RunDir, Timers, load_model, rollout, summarize, trajectory_score
from esopt.train.config import BaseTrainConfig, Section
from esopt.utils.signals import defer_sigint

STATE_FILE = "pg_state.pt"  # optimizer (+ critic) state inside a checkpoint dir


class PGSection(Section):
    """Hyper-parameters GRPO and PPO share (each trainer overrides some defaults)."""

    tasks_per_step: int = Field(128, ge=1, description="distinct training tasks per optimisation step")
    reward: Literal["env", "success", "shaped"] = Field(
        "env", description="episode score: env reward, success, or info['shaped_reward'] (as ES's member score)")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate of the policy")
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(1e-8, gt=0)
    max_grad_norm: float = Field(1.0, ge=0, description="clip the policy (and critic) gradient norm; 0: no clipping")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip: ratio kept in [1-eps, 1+eps]")
    kl_beta: float = Field(1e-3, ge=0, description="k3 KL penalty to a frozen copy of the initial model; 0: none")
    epochs: int = Field(1, ge=1, description="passes over each step's samples")
    minibatch_size: int = Field(256, ge=1, description="(prompt, response) samples per optimizer step")
    micro_batch_size: int = Field(16, ge=1, description="samples per forward/backward (gradient accumulation)")
    loss_agg: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="policy loss: mean over the minibatch's generated tokens, or mean of per-sample means")

    @model_validator(mode="after")
    def _check_pg(self) -> PGSection:
        if self.micro_batch_size > self.minibatch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must not exceed minibatch_size "
                             f"({self.minibatch_size})")
        if not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam_betas must lie in [0, 1) (got {list(self.adam_betas)})")
        return self


def pg_section(config: BaseTrainConfig) -> PGSection:
    return getattr(config, config.algo)


def logprob_temperature(config: BaseTrainConfig) -> float:
    return config.sampling.temperature or 1.0


def episode_scores(trajectories: list[Trajectory], kind: str) -> np.ndarray:
    """One score per episode, defined exactly as ES's member score of a single-episode member."""
    return np.array([trajectory_score(t, kind) for t in trajectories], dtype=np.float64)


# --- samples and batches --------------------------------------------------------------------------

@dataclass
class TurnSample:
    """One (prompt, response) training sample: one agent turn of one trajectory."""

    prompt_ids: list[int]
    token_ids: list[int]  # the policy's own generated ids, exactly as produced
    advantage: float = 0.0
    ret: float = 0.0  # PPO: the value target
    traj: int = 0  # index of the trajectory in the step's rollout
    turn: int = 0


def turn_samples(trajectories: list[Trajectory], advantages: list[list[float]], keep_empty: bool = False
                 ) -> list[TurnSample]:
    """Every turn becomes a sample with its advantage; turns with no generated token are dropped
    unless keep_empty (they carry no policy gradient, but PPO still fits their value)."""
    out = []
    for i, (traj, advs) in enumerate(zip(trajectories, advantages, strict=True)):
        if len(advs) != len(traj.turns):
            raise ValueError(f"trajectory {i}: {len(advs)} advantages for {len(traj.turns)} turns")
        for k, (turn, adv) in enumerate(zip(traj.turns, advs)):
            if turn.token_ids or keep_empty:
                out.append(TurnSample(list(turn.prompt_ids), list(turn.token_ids), float(adv), traj=i, turn=k))
    return out


@dataclass
class TokenBatch:
    """Right-padded samples. Position t of the (N, L-1) tensors scores target token input_ids[:, t+1]."""

    input_ids: torch.Tensor  # (N, L) prompt + response, right-padded
    attention_mask: torch.Tensor  # (N, L)
    mask: torch.Tensor  # (N, L-1) float: 1 where the target is a generated token
    lengths: torch.Tensor  # (N,) real lengths
    prompt_last: torch.Tensor  # (N,) index of the last prompt token (where the critic reads the value)
    advantages: torch.Tensor  # (N,)
    returns: torch.Tensor  # (N,)
    old_logprobs: torch.Tensor | None = None  # (N, L-1)
    ref_logprobs: torch.Tensor | None = None  # (N, L-1)
    old_values: torch.Tensor | None = None  # (N,)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> TokenBatch:
        """Rows idx, trimmed to their longest real length."""
        idx = idx.to(self.input_ids.device)
        n = int(self.lengths[idx].max()) if len(idx) else 1
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                out[f.name] = None
            elif v.dim() == 2:
                out[f.name] = v[idx, : n if v.shape[1] == self.input_ids.shape[1] else n - 1]
            else:
                out[f.name] = v[idx]
        return TokenBatch(**out)


def collate(samples: list[TurnSample], pad_id: int, device: torch.device | str = "cpu") -> TokenBatch:
    n = len(samples)
    lengths = [len(s.prompt_ids) + len(s.token_ids) for s in samples]
    width = max(lengths, default=1)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, max(width - 1, 0)))
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.token_ids)
        ids[i, : p + r] = torch.tensor(s.prompt_ids + s.token_ids, dtype=torch.long)
        attn[i, : p + r] = 1
        mask[i, max(p - 1, 0) : p + r - 1] = 1.0  # a first token with no prompt before it cannot be scored
    prompt_last = torch.tensor([max(len(s.prompt_ids) - 1, 0) for s in samples], dtype=torch.long)
    return TokenBatch(
        input_ids=ids.to(device), attention_mask=attn.to(device), mask=mask.to(device),
        lengths=torch.tensor(lengths, dtype=torch.long, device=device), prompt_last=prompt_last.to(device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        returns=torch.tensor([s.ret for s in samples], dtype=torch.float32, device=device),
    )


# --- log-probs and losses -------------------------------------------------------------------------

def token_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """(N, L-1) log p(input_ids[:, t+1] | prefix) under log_softmax(logits / temperature), in fp32.

    Only positions from the shortest prompt on are scored (`logits_to_keep`): the (N, L, V) logits of
    long prompts are never built. Positions before that window hold 0 (they are masked anyway).
    """
    width = batch.input_ids.shape[1]
    keep = width - int(batch.prompt_last.min()) if len(batch) else width
    kwargs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    try:
        logits = model(**kwargs, logits_to_keep=keep).logits  # (N, keep, V)
    except TypeError:  # a model without `logits_to_keep`
        logits = model(**kwargs).logits[:, width - keep:]
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = logp.gather(-1, batch.input_ids[:, width - keep + 1:, None]).squeeze(-1)  # (N, keep-1)
    return torch.nn.functional.pad(picked, (width - keep, 0))


def micro_batches(n: int, size: int) -> Iterable[torch.Tensor]:
    return torch.arange(n).split(size)


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float, micro: int) -> torch.Tensor:
    """No-grad token log-probs of a whole batch, micro-batch by micro-batch; zero outside each row."""
    out = torch.zeros_like(batch.mask)
    for idx in micro_batches(len(batch), micro):
        idx = idx.to(out.device)
        part = batch.select(idx)
        out[idx, : part.mask.shape[1]] = token_logprobs(model, part, temperature) * part.mask
    return out


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


@dataclass
class Norm:
    """Minibatch-level denominators, so gradient accumulation over micro-batches equals one big batch."""

    tokens: float  # generated tokens in the minibatch
    seqs: float  # samples with at least one generated token
    samples: float  # all samples


def minibatch_norm(batch: TokenBatch, idx: torch.Tensor) -> Norm:
    m = batch.mask[idx.to(batch.mask.device)]
    return Norm(tokens=max(float(m.sum()), 1.0), seqs=max(float((m.sum(1) > 0).sum()), 1.0), samples=max(len(idx), 1))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: str, norm: Norm) -> torch.Tensor:
    """This micro-batch's share of the minibatch mean (token_mean or seq_mean); masked-out tokens add 0."""
    if agg == "seq_mean":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / norm.seqs
    return masked_sum(per_token, mask) / norm.tokens


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = ref - logp (>= 0); 0 where masked."""
    d = (ref_logp - logp) * mask
    return torch.exp(d) - d - 1


def policy_loss(logp: torch.Tensor, batch: TokenBatch, section: PGSection, norm: Norm
                ) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
    """Clipped surrogate + kl_beta * k3 KL, aggregated over generated tokens; stats as (sum, count)."""
    mask = batch.mask
    logratio = (logp - batch.old_logprobs) * mask  # masked before exp: padding never overflows
    ratio = torch.exp(logratio)
    adv = batch.advantages[:, None]
    eps = section.clip_eps
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    tokens = float(mask.sum())
    with torch.no_grad():
        stats = {
            "pg_loss": (float(aggregate(per_token, mask, section.loss_agg, norm)), len(batch) / norm.samples),
            "clipfrac": (float(masked_sum(((ratio - 1).abs() > eps).float(), mask)), tokens),
            "approx_kl": (float(masked_sum((ratio - 1) - logratio, mask)), tokens),
        }
    if batch.ref_logprobs is not None and section.kl_beta > 0:
        kl = kl_k3(logp, batch.ref_logprobs, mask)
        per_token = per_token + section.kl_beta * kl
        stats["kl"] = (float(masked_sum(kl.detach(), mask)), tokens)
    return aggregate(per_token, mask, section.loss_agg, norm), stats


# --- optimisation ---------------------------------------------------------------------------------

class MasterAdamW:
    """AdamW whose state and updates live in fp32 while the model may compute in bf16/fp16.

    A bf16 weight cannot take a step below its resolution (~0.4% of its size): plain AdamW at lr 1e-6 on
    bf16 SmolLM2 changed 0.39% of the weights in two steps. So every low-precision parameter gets an fp32
    master copy; gradients are moved onto it (`collect_grads`), AdamW steps the masters, and the model's
    weights are the masters rounded (`step`). fp32 parameters are their own masters (no copy, no cost).
    """

    def __init__(self, groups: list[tuple[str, list[torch.nn.Parameter], float]], section: PGSection):
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        opt_groups = []
        for name, params, lr in groups:
            masters = []
            for p in params:
                m = p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float().clone())
                self.pairs.append((p, m))
                masters.append(m)
            opt_groups.append({"params": masters, "lr": lr, "name": name})
        self.optimizer = torch.optim.AdamW(opt_groups, betas=tuple(section.adam_betas), eps=section.adam_eps,
                                           weight_decay=section.weight_decay)
        self.param_groups = self.optimizer.param_groups  # the masters, grouped (clipping reads them)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, m in self.pairs:
            p.grad = m.grad = None

    def collect_grads(self) -> None:
        """Move the model's gradients onto the fp32 masters (after backward, before clipping)."""
        for p, m in self.pairs:
            if m is not p and p.grad is not None:
                m.grad, p.grad = p.grad.float(), None

    @torch.no_grad()
    def step(self) -> None:
        self.optimizer.step()
        for p, m in self.pairs:
            if m is not p:
                p.copy_(m)

    def state_dict(self) -> dict:
        return {"adamw": self.optimizer.state_dict(),
                "masters": [m.detach().clone() for p, m in self.pairs if m is not p]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["adamw"])
        copies = [(p, m) for p, m in self.pairs if m is not p]
        if len(copies) != len(state["masters"]):
            raise ValueError(f"checkpoint has {len(state['masters'])} fp32 master tensors, the model needs "
                             f"{len(copies)}: was it saved with another model dtype?")
        for (p, m), saved in zip(copies, state["masters"], strict=True):
            m.copy_(saved)
            p.copy_(m)


def make_optimizer(groups: list[tuple[str, list[torch.nn.Parameter], float]], section: PGSection) -> MasterAdamW:
    """One AdamW over named parameter groups [(name, params, lr)] (e.g. policy and critic), fp32 masters."""
    return MasterAdamW(groups, section)


def shuffle_generator(seed: int, step: int) -> torch.Generator:
    mixed = np.random.SeedSequence([seed % 2**63, step, 17]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed) >> 1)


LossFn = Callable[[TokenBatch, Norm], tuple[torch.Tensor, dict[str, tuple[float, float]]]]


def optimize(batch: TokenBatch, loss_fn: LossFn, optimizer: MasterAdamW, section: PGSection,
             generator: torch.Generator) -> dict[str, float]:
    """`epochs` passes of shuffled minibatches; each minibatch is one optimizer step (gradients
    accumulated over micro-batches, clipped per parameter group). A step whose gradient is not finite
    is skipped, so NaN never reaches the weights."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    losses, norms, skipped = [], defaultdict(list), 0
    max_norm = section.max_grad_norm or math.inf
    for _ in range(section.epochs):
        for mb in torch.randperm(len(batch), generator=generator).split(section.minibatch_size):
            optimizer.zero_grad(set_to_none=True)
            norm, mb_loss = minibatch_norm(batch, mb), 0.0
            for idx in mb.split(section.micro_batch_size):
                loss, stats = loss_fn(batch.select(idx), norm)
                loss.backward()
                mb_loss += float(loss.detach())
                for k, (s, c) in stats.items():
                    sums[k][0] += s
                    sums[k][1] += c
            optimizer.collect_grads()
            finite = True
            for group in optimizer.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                g = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
                norms[group["name"]].append(g)
                finite &= math.isfinite(g)
            if finite and math.isfinite(mb_loss):
                optimizer.step()
            else:
                skipped += 1
            losses.append(mb_loss)
    optimizer.zero_grad(set_to_none=True)
    out = {k: s / max(c, 1e-12) for k, (s, c) in sums.items()}
    out["loss"] = float(np.mean(losses)) if losses else 0.0
    for name, values in norms.items():
        out["grad_norm" if name == "policy" else f"{name}_grad_norm"] = float(np.mean(values))
    out["optimizer_steps"] = len(losses) - skipped
    out["skipped_steps"] = skipped
    return out


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    model.eval().requires_grad_(False)
    return model


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    return freeze(copy.deepcopy(model))


# --- checkpoints ----------------------------------------------------------------------------------

def latest_pg_checkpoint(rd: RunDir) -> tuple[int, Path] | None:
    found = rd.latest_checkpoint()
    while found and not (found[1] / STATE_FILE).exists():  # never resume from a checkpoint missing its state
        found = rd.latest_checkpoint(at_most=found[0] - 1)
    return found


def load_state(path: Path, device: torch.device | str) -> dict:
    return torch.load(path / STATE_FILE, map_location=device, weights_only=True)


# --- the algorithm the shared loop drives ---------------------------------------------------------

class PGAlgorithm(Protocol):
    """What GRPO and PPO implement: which tasks to roll out, and the update from the trajectories."""

    def task_seeds(self, step: int) -> list[int]: ...

    def update(self, trajectories: list[Trajectory], step: int) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


Builder = Callable[[HFPolicy, "torch.nn.Module | None", BaseTrainConfig], PGAlgorithm]


def step_row(trajectories: list[Trajectory], kind: str) -> dict[str, float]:
    scores = episode_scores(trajectories, kind) if trajectories else np.zeros(1)
    pop = summarize(trajectories)
    return {"reward_mean": float(scores.mean()), "reward_max": float(scores.max()),
            "reward_min": float(scores.min()), "reward_std": float(scores.std()),
            "success_rate": pop["success_rate"], "mean_turns": pop["mean_turns"]}


class PolicyGradient:
    """A GRPO or PPO step for `loop.train`: roll out the algorithm's tasks, then its update."""

    unit = "step"

    def __init__(self, algo: PGAlgorithm, policy: HFPolicy, config: BaseTrainConfig, make_env: Callable,
                 timers: Timers, start: int):
        self.algo, self.policy, self.config, self.make_env, self.timers = algo, policy, config, make_env, timers
        self.steps_done = start

    def step(self, step: int) -> dict:
        config, t_step = self.config, time.perf_counter()
        rollout_seed = int(np.random.default_rng([config.seed, step, 3]).integers(2**31))
        trajectories, stats = rollout(self.policy, config, self.make_env, self.algo.task_seeds(step), seed=rollout_seed)
        t_up = time.perf_counter()
        self.timers.rollout += t_up - t_step
        with defer_sigint():  # a step's updates happen completely or not at all
            upd = self.algo.update(trajectories, step)
            self.steps_done = step + 1
        self.policy.weights_changed()
        self.timers.update += time.perf_counter() - t_up
        return {**step_row(trajectories, pg_section(config).reward), "kl": None, **upd,
                "generated_tokens": stats.generated_tokens, "rollout_seconds": t_up - t_step,
                "update_seconds": time.perf_counter() - t_up}

    def describe(self, row: dict) -> str:
        kl = "n/a" if row["kl"] is None else format(row["kl"], ".2e")
        return f" | loss {row['loss']:.4f} kl {kl} clipfrac {row.get('clipfrac', 0.0):.3f}"

    def checkpoint_files(self) -> dict:
        state = self.algo.state_dict()
        return {STATE_FILE: lambda path: torch.save(state, path)}

    def time_note(self, timers: Timers) -> str:
        return f"update share {timers.update / max(timers.update + timers.rollout, 1e-9):.1%}"


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
            policy = load_policy(str(path), dtype=config.model.resolved_dtype, device=config.model.device)
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
