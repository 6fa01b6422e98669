"""Full-parameter evolution strategies over any PyTorch model, at inference-level memory.

    es = ES(model, ESConfig(population_size=32), ledger="run/history.jsonl")
    for generation in range(cfg.total_generations):
        rewards = []
        for member in es.ask():
            with es.perturbed(member):          # theta + sigma * eps_i, restored on exit (exceptions too)
                rewards.append(evaluate(model))
        es.tell(rewards)                         # theta += alpha / G * sum_i w_i * eps_i

Members are seeds, never tensors: noise is regenerated chunk by chunk when needed (`noise.py`).
As in the paper, sigma is folded into alpha: the update is alpha/G * sum w_i eps_i, not alpha/(G sigma).

Restore modes:
- "exact": a master copy of the scoped parameters is kept in fp32 on `master_device` (CPU: off the
  accelerator). Perturb writes master + sigma*eps, restore copies master back (bit-exact in any dtype,
  and faster than regenerating noise), updates accumulate in the fp32 master. Costs one fp32 copy of the
  scoped parameters in host memory. Default: resume, replay and bf16 training are exact with it.
- "subtract": regenerate the noise and subtract it. No extra copy (true inference-level memory), but
  theta + d - d != theta in floating point: fp32 drifts ~1e-7 per cycle, bf16 far more. Use
  `measure_restore_drift` to see it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from esopt.es.ledger import Ledger
from esopt.es.noise import DEFAULT_CHUNK_NUMEL, NoiseSource, noise_spec
from esopt.es.schedules import Schedule, ScheduleKind
from esopt.es.scope import ParamScope, select_parameters
from esopt.es.shaping import check_rewards, get_shaper


@dataclass
class ESConfig:
    population_size: int = 32  # G
    antithetic: bool = False  # members 2k, 2k+1 share a seed with signs +1, -1
    sigma: float = 1e-3
    sigma_min: float = 2.5e-4  # cosine floor; 0 over-fits (paper)
    sigma_schedule: ScheduleKind = "cosine"
    alpha: float = 5e-4
    alpha_min: float = 0.0
    alpha_schedule: ScheduleKind = "constant"
    total_generations: int = 100  # schedule length
    shaping: str = "zscore"
    weight_decay: float = 0.0  # decoupled: theta *= 1 - alpha * weight_decay
    scope: ParamScope = field(default_factory=ParamScope)
    restore: Literal["exact", "subtract"] = "exact"
    master_device: str = "cpu"
    chunk_numel: int = DEFAULT_CHUNK_NUMEL
    seed: int = 0

    def __post_init__(self) -> None:
        if self.population_size < 1:
            raise ValueError(f"population_size must be >= 1, got {self.population_size}")
        if self.antithetic and self.population_size % 2:
            raise ValueError(f"antithetic sampling needs an even population_size, got {self.population_size}")
        if not self.sigma > 0 or self.sigma_min < 0:
            raise ValueError(f"sigma must be > 0 and sigma_min >= 0, got sigma={self.sigma}, sigma_min={self.sigma_min}")
        if self.alpha < 0 or self.alpha_min < 0:
            raise ValueError(f"alpha and alpha_min must be >= 0, got {self.alpha}, {self.alpha_min}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.restore not in ("exact", "subtract"):
            raise ValueError(f"restore must be 'exact' or 'subtract', got {self.restore!r}")
        if isinstance(self.scope, dict):
            self.scope = ParamScope(**self.scope)
        get_shaper(self.shaping)
        self.sigma_at = Schedule(self.sigma_schedule, self.sigma, self.sigma_min, self.total_generations)
        self.alpha_at = Schedule(self.alpha_schedule, self.alpha, self.alpha_min, self.total_generations)


@dataclass(frozen=True)
class Member:
    index: int
    seed: int
    sign: int = 1  # -1 for the mirrored half of an antithetic pair


def member_seeds(seed: int, generation: int, population_size: int, antithetic: bool) -> list[Member]:
    """Members of one generation, derived from (seed, generation) alone so a resumed run asks the same."""
    n_seeds = population_size // 2 if antithetic else population_size
    seeds = np.random.default_rng([seed, generation]).integers(0, 2**62, size=n_seeds)
    if not antithetic:
        return [Member(i, int(s)) for i, s in enumerate(seeds)]
    return [Member(2 * k + j, int(s), 1 - 2 * j) for k, s in enumerate(seeds) for j in (0, 1)]


class ParameterNoise:
    """Perturb, restore and update a fixed list of parameters with seeded noise."""

    def __init__(self, params: Sequence[tuple[str, torch.nn.Parameter]], restore: str = "exact",
                 master_device: str = "cpu", chunk_numel: int = DEFAULT_CHUNK_NUMEL):
        self.params = list(params)
        self.restore_mode = restore
        self.noise = NoiseSource(chunk_numel)
        self.masters: list[torch.Tensor] | None = None
        if restore == "exact":
            self.masters = [p.detach().to(master_device, torch.float32, copy=True).view(-1) for _, p in self.params]

    @property
    def numel(self) -> int:
        return sum(p.numel() for _, p in self.params)

    @torch.no_grad()
    def perturb(self, seed: int, scale: float, upto: int | None = None) -> Iterator[int]:
        """theta_k += scale * eps_k for the first `upto` tensors; yields k after each one is done."""
        for k, (name, p) in enumerate(self.params[:upto]):
            flat, done = p.data.view(-1), 0
            try:
                for s, e, eps in self.noise.chunks(seed, name, flat.numel(), p.device):
                    self._add_noise(k, flat, s, e, eps, scale)
                    done = e
            except BaseException:  # interrupted mid-tensor: undo its finished chunks, then re-raise
                for s, e, eps in self.noise.chunks(seed, name, done, p.device):
                    self._add_noise(k, flat, s, e, eps, -scale, undo=True)
                raise
            yield k

    def _add_noise(self, k: int, flat: torch.Tensor, s: int, e: int, eps: torch.Tensor, scale: float,
                   undo: bool = False) -> None:
        if self.masters is not None:  # write from the fp32 master: exact in any dtype
            src = self.masters[k][s:e].to(flat.device)  # no copy on the same device: add out of place
            flat[s:e].copy_(src if undo else torch.add(src, eps, alpha=scale))
        elif flat.dtype == torch.float32:
            flat[s:e].add_(eps, alpha=scale)
        else:
            flat[s:e].copy_(flat[s:e].float().add_(eps, alpha=scale))

    @torch.no_grad()
    def restore(self, seed: int, scale: float, upto: int | None = None) -> None:
        """Undo perturb(seed, scale) on the first `upto` tensors (all by default)."""
        if self.masters is None:
            for _ in self.perturb(seed, -scale, upto):
                pass
            return
        for (_, p), m in zip(self.params[:upto], self.masters):
            p.data.view(-1).copy_(m)

    @torch.no_grad()
    def combine(self, coefs: dict[int, float]) -> list[torch.Tensor]:
        """sum_seed coef * eps_seed for every parameter, whole tensors in fp32 on its device (for analyses;
        `update` applies the same sum chunk by chunk without materialising it)."""
        out = []
        for name, p in self.params:
            acc = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            for seed, c in coefs.items():
                if c:
                    acc.add_(self.noise.full(seed, name, p.shape, device=p.device), alpha=c)
            out.append(acc)
        return out

    @torch.no_grad()
    def update(self, coefs: dict[int, float], step: float, decay: float = 0.0) -> float:
        """theta = theta * (1 - decay) + step * sum_seed coef_seed * eps_seed, accumulated in fp32.

        Seeds are summed in the order given, so training and replay do identical floating-point
        operations (bit-exact replay in fp32). Returns the RMS of the applied change.
        """
        sq, count = 0.0, 0
        for k, (name, p) in enumerate(self.params):
            flat = p.data.view(-1)
            target = self.masters[k] if self.masters is not None else flat
            for j, s, e in self.noise.bounds(flat.numel()):
                acc = torch.zeros(e - s, dtype=torch.float32, device=p.device)
                for seed, c in coefs.items():
                    acc.add_(self.noise.chunk(seed, name, j, e - s, p.device), alpha=c * step)
                sq += float(torch.dot(acc, acc))
                count += e - s
                chunk = target[s:e]
                if decay:
                    chunk.mul_(1.0 - decay)
                if chunk.dtype == torch.float32:
                    chunk.add_(acc.to(chunk.device))
                else:
                    chunk.copy_(chunk.float().add_(acc))
            if self.masters is not None:
                flat.copy_(self.masters[k])
        return math.sqrt(sq / max(count, 1))


def update_coefficients(record: dict) -> dict[int, float]:
    """Per unique seed, sum of sign * weight over its members (an antithetic pair needs one noise draw)."""
    coefs: dict[int, float] = {}
    for seed, sign, w in zip(record["seeds"], record["signs"], record["weights"]):
        coefs[int(seed)] = coefs.get(int(seed), 0.0) + float(sign) * float(w)
    return {s: c for s, c in coefs.items() if c != 0.0}


def apply_record(noise: ParameterNoise, record: dict) -> float:
    """Apply one generation's update from its ledger record (used by tell and by replay)."""
    step = record["alpha"] / record["population_size"]
    return noise.update(update_coefficients(record), step, decay=record["alpha"] * record["weight_decay"])


@dataclass
class TellResult:
    generation: int
    weights: np.ndarray
    sigma: float
    alpha: float
    update_rms: float
    zero_variance: bool


class ES:
    """Ask/tell evolution strategy bound to one model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, config: ESConfig | None = None,
                 ledger: str | Path | Ledger | None = None, generation: int = 0):
        self.model = model
        self.config = config or ESConfig()
        self.generation = generation
        self.ledger = Ledger(ledger) if isinstance(ledger, (str, Path)) else ledger
        self.shaper = get_shaper(self.config.shaping)
        params = select_parameters(model, self.config.scope)
        self.noise = ParameterNoise(params, self.config.restore, self.config.master_device, self.config.chunk_numel)
        self._members: list[Member] | None = None
        self._active: Member | None = None

    @property
    def sigma(self) -> float:
        return self.config.sigma_at(self.generation)

    @property
    def alpha(self) -> float:
        return self.config.alpha_at(self.generation)

    def ask(self, generation: int | None = None) -> list[Member]:
        if generation is not None:
            self.generation = generation
        c = self.config
        self._members = member_seeds(c.seed, self.generation, c.population_size, c.antithetic)
        return self._members

    @contextlib.contextmanager
    def perturbed(self, member: Member) -> Iterator[torch.nn.Module]:
        """theta + sigma * sign * eps_member inside the block; restored on exit, exceptions included."""
        if self._active is not None:
            raise RuntimeError(f"member {self._active.index} is still applied; nested perturbation is not allowed")
        scale, done = self.sigma * member.sign, 0
        self._active = member
        try:
            for k in self.noise.perturb(member.seed, scale):
                done = k + 1
            yield self.model
        finally:
            self.noise.restore(member.seed, scale, upto=done)
            self._active = None

    def tell(self, rewards: Sequence[float]) -> TellResult:
        """Shape rewards, apply theta += alpha/G * sum_i w_i eps_i, append the ledger line, advance."""
        if self._members is None:
            raise RuntimeError("tell() called before ask()")
        r = check_rewards(rewards)
        if r.size != len(self._members):
            raise ValueError(f"got {r.size} rewards for a population of {len(self._members)} members")
        weights = self.shaper(r)
        record = self.record(r, weights)
        rms = apply_record(self.noise, record) if self.alpha > 0 else 0.0
        if self.ledger is not None:
            self.ledger.append(record)
        result = TellResult(self.generation, weights, self.sigma, self.alpha, rms, bool(np.all(weights == 0)))
        self.generation += 1
        self._members = None
        return result

    def record(self, rewards: np.ndarray, weights: np.ndarray) -> dict:
        c, members = self.config, self._members or []
        return {
            "generation": self.generation,
            "population_size": c.population_size,
            "seeds": [m.seed for m in members],
            "signs": [m.sign for m in members],
            "rewards": [float(x) for x in rewards],
            "weights": [float(x) for x in weights],
            "alpha": self.alpha,
            "sigma": self.sigma,
            "weight_decay": c.weight_decay,
            "shaping": c.shaping,
            "scope": c.scope.to_dict(),
            "restore": c.restore,
            "noise": noise_spec(c.chunk_numel),
        }


@torch.no_grad()
def measure_restore_drift(model: torch.nn.Module, config: ESConfig, cycles: int = 10) -> dict[str, float]:
    """Run `cycles` perturb/restore cycles and report how far the weights moved (0 for exact restore)."""
    es = ES(model, config)
    before = [p.detach().clone() for _, p in es.noise.params]
    for g in range(cycles):
        member = es.ask(g)[0]
        with es.perturbed(member):
            pass
    diffs = [(p.detach().float() - b.float()).abs().view(-1) for (_, p), b in zip(es.noise.params, before)]
    d = torch.cat(diffs)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "frac_changed": float((d > 0).float().mean())}
