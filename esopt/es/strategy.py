"""Full-parameter evolution strategies over any PyTorch model, at inference-level memory.

    es = ES(model, ESConfig(population_size=32), ledger="run/history.jsonl")
    for generation in range(es.config.total_generations):
        rewards = []
        for member in es.ask():
            with es.perturbed(member):          # theta + sigma * eps_i, restored on exit (exceptions too)
                rewards.append(evaluate(model))
        es.tell(rewards)                         # theta += alpha / G * sum_i w_i * eps_i

Members are seeds, never tensors: noise is regenerated chunk by chunk when needed. How noise is written
into the weights sits behind `Perturbation` (`perturbation.py`, the weight-host seam), built from the
config's noise kind. As in the paper, sigma is folded into alpha: the update is alpha/G * sum w_i eps_i,
not alpha/(G sigma).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from esopt.es.config import ESConfig
from esopt.es.ledger import Ledger
from esopt.es.perturbation import Perturbation, apply_record, build_perturbation
from esopt.es.scope import select_parameters
from esopt.es.shaping import check_rewards, get_shaper
from esopt.utils.faults import pause_point


@dataclass(frozen=True)
class Member:
    index: int
    seed: int
    sign: int = 1  # -1 for the mirrored half of an antithetic pair


def population_members(seed: int, generation: int, population_size: int, antithetic: bool) -> list[Member]:
    """Members of one generation, derived from (seed, generation) alone so a resumed run asks the same."""
    n_seeds = population_size // 2 if antithetic else population_size
    seeds = np.random.default_rng([seed, generation]).integers(0, 2**62, size=n_seeds)
    if not antithetic:
        return [Member(i, int(s)) for i, s in enumerate(seeds)]
    return [Member(2 * k + j, int(s), 1 - 2 * j) for k, s in enumerate(seeds) for j in (0, 1)]


@dataclass
class TellResult:
    generation: int
    weights: np.ndarray
    sigma: float
    alpha: float
    update_rms: float
    zero_variance: bool


class ES:
    """Ask/tell evolution strategy bound to one model (see the module docstring).

    `on_weights_changed` is called after every perturb, restore and update, so a policy backend can
    drop what it cached for the old weights."""

    def __init__(self, model: torch.nn.Module, config: ESConfig | None = None,
                 ledger: str | Path | Ledger | None = None, generation: int = 0,
                 on_weights_changed: Callable[[], None] | None = None):
        self.model = model
        self.config = config or ESConfig()
        self.config.sigma_at(0)  # fails now, not mid-run, if the schedule length is missing
        self.generation = generation
        self.ledger = Ledger(ledger) if isinstance(ledger, (str, Path)) else ledger
        self.shaper = get_shaper(self.config.shaping)
        self.on_weights_changed = on_weights_changed or (lambda: None)
        params = select_parameters(model, self.config.param_scope)
        spec = {**self.config.noise_spec(), "device": params[0][1].device.type}  # noise is drawn beside the weights
        self.perturbation: Perturbation = build_perturbation(params, spec, self.config.restore,
                                                             self.config.master_device)
        self._members: list[Member] | None = None
        self._active: Member | None = None
        self.last_record: dict | None = None  # the ledger line of the last tell (what replicas sync with)

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
        self._members = population_members(c.seed, self.generation, c.population_size, c.antithetic)
        return self._members

    @contextlib.contextmanager
    def perturbed(self, member: Member, sigma: float | None = None) -> Iterator[torch.nn.Module]:
        """theta + sigma * sign * eps_member inside the block (sigma: this generation's unless given);
        restored on exit, exceptions included."""
        if self._active is not None:
            raise RuntimeError(f"member {self._active.index} is still applied; nested perturbation is not allowed")
        scale, done = (self.sigma if sigma is None else sigma) * member.sign, 0
        self._active = member
        try:
            self.perturbation.hold()  # restore "none": a copy of the weights while the member is applied
            for k in self.perturbation.perturb(member.seed, scale):
                done = k + 1
            self.on_weights_changed()
            yield self.model
        finally:
            self.perturbation.restore(member.seed, scale, upto=done)
            self._active = None
            self.on_weights_changed()

    def tell(self, rewards: Sequence[float], extra: dict | None = None) -> TellResult:
        """Shape rewards, apply theta += alpha/G * sum_i w_i eps_i, append the ledger line (plus `extra`
        fields, e.g. the prompt version the rollouts used), advance."""
        if self._members is None:
            raise RuntimeError("tell() called before ask()")
        r = check_rewards(rewards)
        if r.size != len(self._members):
            raise ValueError(f"got {r.size} rewards for a population of {len(self._members)} members")
        weights = self.shaper(r)
        record = {**self.record(r, weights), **(extra or {})}
        rms = apply_record(self.perturbation, record)
        self.last_record = record
        self.on_weights_changed()
        if self.ledger is not None:
            self.ledger.append(record)
            pause_point("ledger", generation=self.generation)  # tests: kill between the ledger and the rest
        result = TellResult(self.generation, weights, self.sigma, self.alpha, rms, bool(np.all(weights == 0)))
        self.generation += 1
        self._members = None
        return result

    def fast_forward(self, records: Sequence[dict]) -> None:
        """Apply ledger lines (generations 0.. or those after a checkpoint's) through this ES's own perturbation,
        as `replay` does, so a stateful optimiser (Adam) continues from the moments they imply."""
        for r in records:
            if r["generation"] != self.generation:
                raise ValueError(f"ledger line for generation {r['generation']} applied at generation "
                                 f"{self.generation}")
            apply_record(self.perturbation, r)
            self.generation += 1
        self.on_weights_changed()

    def record(self, rewards: np.ndarray, weights: np.ndarray) -> dict:
        c, members = self.config, self._members or []
        # absent for SGD, so old ledgers' lines stay as they were
        optimizer = {"optimizer": spec} if (spec := c.optimizer_spec()) else {}
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
            "scope": c.param_scope.to_dict(),
            "restore": self.perturbation.restore_mode,  # what replay must use ("auto" resolved)
            "noise": self.perturbation.spec,
            **optimizer,
        }


@torch.no_grad()
def measure_restore_drift(model: torch.nn.Module, config: ESConfig, cycles: int = 10) -> dict[str, float]:
    """Run `cycles` perturb/restore cycles and report how far the weights moved (0 for exact restore)."""
    es = ES(model, config)
    before = [p.detach().clone() for _, p in es.perturbation.params]
    for g in range(cycles):
        member = es.ask(g)[0]
        with es.perturbed(member):
            pass
    diffs = [(p.detach().float() - b.float()).abs().view(-1) for (_, p), b in zip(es.perturbation.params, before)]
    d = torch.cat(diffs)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "frac_changed": float((d > 0).float().mean())}
