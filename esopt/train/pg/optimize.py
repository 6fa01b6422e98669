"""AdamW on fp32 masters, minibatch epochs with gradient accumulation and clipping, frozen references."""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import torch

from esopt.train.config import PGSection
from esopt.train.pg.batch import TokenBatch
from esopt.train.pg.loss import Norm, minibatch_norm, prefix_once


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
        self.base_lrs = [lr for _, _, lr in groups]  # the config's, which `scale_lr` scales (not a checkpoint's)
        self.optimizer = torch.optim.AdamW(opt_groups, betas=tuple(section.adam_betas), eps=section.adam_eps,
                                           weight_decay=section.weight_decay)
        self.param_groups = self.optimizer.param_groups  # the masters, grouped (clipping reads them)

    def scale_lr(self, factor: float) -> None:
        """Every group's learning rate = its configured one x factor (an lr schedule's value at this step)."""
        for group, lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = lr * factor

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


def lr_factor(schedule: str, step: int, steps: int) -> float:
    """The schedule's multiplier of the learning rate at 0-based training step `step` of `steps`: linear is
    transformers' `get_linear_schedule_with_warmup` without warmup (1 at the first step, 1/steps at the last)."""
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (steps - step) / steps)
    raise ValueError(f"unknown lr_schedule {schedule!r}: use constant or linear")


def shuffle_generator(seed: int, step: int) -> torch.Generator:
    mixed = np.random.SeedSequence([seed % 2**63, step, 17]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed) >> 1)


LossFn = Callable[[TokenBatch, Norm], tuple[torch.Tensor, dict[str, tuple[float, float]]]]


def optimize(batch: TokenBatch, loss_fn: LossFn, optimizer: MasterAdamW, section: PGSection,
             generator: torch.Generator, models: Sequence[torch.nn.Module] = ()) -> dict[str, float]:
    """`epochs` passes of shuffled minibatches; each minibatch is one optimizer step (gradients
    accumulated over micro-batches, clipped per parameter group). A step whose gradient is not finite
    is skipped, so NaN never reaches the weights. `models` (the ones `loss_fn` runs) encode the prompts'
    shared prefix once per minibatch (`prefix_once`)."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    losses, norms, skipped = [], defaultdict(list), 0
    max_norm = section.max_grad_norm or math.inf
    for _ in range(section.epochs):
        for mb in torch.randperm(len(batch), generator=generator).split(section.minibatch_size):
            optimizer.zero_grad(set_to_none=True)
            norm, mb_loss = minibatch_norm(batch, mb), 0.0
            with prefix_once(models, batch.select(mb)):
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
