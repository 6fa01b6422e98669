"""The weight-host seam: how one member's noise is written into a list of parameters and removed again,
and how a generation's update is applied.

A `Perturbation` is built from a ledger's noise spec (`build_perturbation`), so `ES`, `replay` and any
replica (a Ray worker, a GPU engine) that holds the same weights make the same numbers. A noise kind is
one subclass registered under its spec's `dist` name: `GaussianNoise` ("normal", dense, chunked) is the
default; a low-rank kind overrides `perturb`/`update`/`combine` (restore is shared); a kind that only
changes the random numbers (see the Rademacher kind in the tests) overrides `draw`.

Restore modes:
- "exact": a master copy of the parameters is kept in fp32 on `master_device` (CPU: off the
  accelerator). Perturb writes master + sigma*eps, restore copies the master back (bit-exact in any
  dtype, and faster than regenerating noise); updates accumulate in the fp32 master. Costs one fp32
  copy of the parameters in host memory. Default: resume, replay and bf16 training are exact with it.
- "subtract": regenerate the noise and subtract it. No extra copy (true inference-level memory), but
  theta + d - d != theta in floating point: fp32 drifts ~1e-7 per cycle, bf16 far more.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch

from esopt.es.kinds import DEFAULT_CHUNK_NUMEL, PERTURBATIONS, perturbation_class
from esopt.es.noise import NoiseSource

Params = Sequence[tuple[str, torch.nn.Parameter]]


class Perturbation:
    """Seeded noise over a fixed list of (name, parameter): perturb, restore, update.

    Subclasses set `dist` (the spec's name for the kind) and `version` (bumped whenever the numbers a
    spec produces change, so an old ledger is refused instead of replayed wrongly)."""

    dist: ClassVar[str] = ""
    version: ClassVar[int] = 1

    def __init__(self, params: Params, spec: dict, restore: str = "exact", master_device: str = "cpu"):
        if restore not in ("exact", "subtract"):
            raise ValueError(f"restore must be 'exact' or 'subtract', got {restore!r}")
        check_spec(spec, type(self))
        self.params = list(params)
        # CUDA and CPU generators give different numbers for one seed: the spec records where noise is
        # drawn (`ES` sets it; ledgers from before the field were all drawn on the CPU)
        where = self.params[0][1].device.type if self.params else "cpu"
        drawn = spec.get("device", "cpu")
        if drawn != where:
            raise ValueError(f"this noise was drawn on {drawn} but the weights are on {where}: the two give "
                             f"different numbers for the same seed; replay on {drawn}")
        self.spec = {**spec, "device": where}
        self.restore_mode = restore
        self.noise = NoiseSource(int(spec["chunk_numel"]))
        self.masters: list[torch.Tensor] | None = None
        if restore == "exact":
            self.masters = [p.detach().to(master_device, torch.float32, copy=True).view(-1) for _, p in self.params]

    @classmethod
    def make_spec(cls, chunk_numel: int = DEFAULT_CHUNK_NUMEL, **options) -> dict:
        """The ledger's description of this kind; `options` are kind-specific (lowrank: rank, others)."""
        return {"version": cls.version, "dist": cls.dist, "dtype": "float32", "chunk_numel": chunk_numel}

    @property
    def numel(self) -> int:
        return sum(p.numel() for _, p in self.params)

    def perturb(self, seed: int, scale: float, upto: int | None = None) -> Iterator[int]:
        """theta_k += scale * eps_k for the first `upto` tensors; yields k after each one is done."""
        raise NotImplementedError

    @torch.no_grad()
    def restore(self, seed: int, scale: float, upto: int | None = None) -> None:
        """Undo perturb(seed, scale) on the first `upto` tensors (all by default): copy the fp32 master back
        (exact), or perturb by -scale (subtract mode)."""
        if self.masters is None:
            for _ in self.perturb(seed, -scale, upto):
                pass
            return
        for (_, p), m in zip(self.params[:upto], self.masters):
            p.data.view(-1).copy_(m)

    def update(self, coefs: dict[int, float], step: float, decay: float = 0.0) -> float:
        """theta = theta * (1 - decay) + step * sum_seed coef_seed * eps_seed; returns the change's RMS."""
        raise NotImplementedError

    def combine(self, coefs: dict[int, float]) -> list[torch.Tensor]:
        """sum_seed coef * eps_seed for every parameter as whole fp32 tensors (analyses)."""
        raise NotImplementedError


class GaussianNoise(Perturbation):
    """Dense N(0, 1) noise, drawn chunk by chunk (`noise.py`), so the extra memory is one chunk."""

    dist = "normal"
    version = 1

    def draw(self, seed: int, name: str, k: int, length: int, device: torch.device) -> torch.Tensor:
        """Chunk k of tensor `name`'s noise for a member seed; valid until the next draw."""
        return self.noise.chunk(seed, name, k, length, device)

    def chunks(self, seed: int, name: str, numel: int, device: torch.device) -> Iterator[tuple[int, int, torch.Tensor]]:
        for k, start, end in self.noise.bounds(numel):
            yield start, end, self.draw(seed, name, k, end - start, device)

    @torch.no_grad()
    def perturb(self, seed: int, scale: float, upto: int | None = None) -> Iterator[int]:
        for k, (name, p) in enumerate(self.params[:upto]):
            flat, done = p.data.view(-1), 0
            try:
                for s, e, eps in self.chunks(seed, name, flat.numel(), p.device):
                    self._add_noise(k, flat, s, e, eps, scale)
                    done = e
            except BaseException:  # interrupted mid-tensor: undo its finished chunks, then re-raise
                for s, e, eps in self.chunks(seed, name, done, p.device):
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
    def combine(self, coefs: dict[int, float]) -> list[torch.Tensor]:
        out = []
        for name, p in self.params:
            acc = torch.zeros(p.numel(), dtype=torch.float32, device=p.device)
            for seed, c in coefs.items():
                if c:
                    for s, e, eps in self.chunks(seed, name, p.numel(), p.device):
                        acc[s:e].add_(eps, alpha=c)
            out.append(acc.view(p.shape))
        return out

    @torch.no_grad()
    def update(self, coefs: dict[int, float], step: float, decay: float = 0.0) -> float:
        """Accumulated in fp32, seeds summed in the order given, so training and replay do identical
        floating-point operations (bit-exact replay in fp32)."""
        sq, count = 0.0, 0
        for k, (name, p) in enumerate(self.params):
            flat = p.data.view(-1)
            target = self.masters[k] if self.masters is not None else flat
            for j, s, e in self.noise.bounds(flat.numel()):
                acc = torch.zeros(e - s, dtype=torch.float32, device=p.device)
                for seed, c in coefs.items():
                    acc.add_(self.draw(seed, name, j, e - s, p.device), alpha=c * step)
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


def register_perturbation(cls: type[Perturbation]) -> type[Perturbation]:
    """Make a noise kind available to `ES` (config `noise: <dist>`) and to `replay` (usable as a decorator)."""
    if not cls.dist:
        raise ValueError(f"{cls.__name__} needs a `dist` name")
    PERTURBATIONS[cls.dist] = cls
    return cls


register_perturbation(GaussianNoise)


def check_spec(spec: dict, cls: type[Perturbation]) -> None:
    if spec.get("dist") != cls.dist:
        raise ValueError(f"noise spec {spec} is not of kind {cls.dist!r}")
    if spec.get("version") != cls.version:
        raise ValueError(f"noise spec of kind {cls.dist!r} has version {spec.get('version')}, "
                         f"this esopt makes version {cls.version}: replay it with the esopt that wrote it")


def build_perturbation(params: Params, spec: dict, restore: str = "exact", master_device: str = "cpu"
                       ) -> Perturbation:
    """The perturbation a noise spec (a ledger line's `noise`) describes, over `params`."""
    return perturbation_class(spec.get("dist", ""))(params, spec, restore, master_device)


def update_coefficients(record: dict) -> dict[int, float]:
    """Per unique seed, sum of sign * weight over its members (an antithetic pair needs one noise draw)."""
    coefs: dict[int, float] = {}
    for seed, sign, w in zip(record["seeds"], record["signs"], record["weights"]):
        coefs[int(seed)] = coefs.get(int(seed), 0.0) + float(sign) * float(w)
    return {s: c for s, c in coefs.items() if c != 0.0}


def apply_record(perturbation: Perturbation, record: dict) -> float:
    """Apply one generation's update from its ledger line (used by tell, replay and replica sync)."""
    if record["alpha"] <= 0:
        return 0.0
    step = record["alpha"] / record["population_size"]
    return perturbation.update(update_coefficients(record), step, decay=record["alpha"] * record["weight_decay"])


class LowRankNoise(Perturbation):
    """EGGROLL-style low-rank noise: member i perturbs a matrix W (out x in) by sigma * A_i B_i^T / sqrt(r),
    with A_i (out x r) and B_i (in x r) standard normal from the member's seed. Far fewer random numbers
    than dense noise ((out + in) r instead of out * in); the update sum_i w_i A_i B_i^T is full rank.

    Matrices get low-rank noise; other parameters (norms, biases) are frozen (`others: frozen`, default) or
    get dense Gaussian noise (`others: full`). Outer products are accumulated one rank-1 term at a time
    (`addr_`), element by element, so the result does not depend on the BLAS thread count: replay is
    bit-exact on any machine of the same device type.
    """

    dist = "lowrank"
    version = 1

    def __init__(self, params: Params, spec: dict, restore: str = "exact", master_device: str = "cpu"):
        self.rank = int(spec.get("rank", 1))
        self.others = spec.get("others", "frozen")
        if self.rank < 1 or self.others not in ("frozen", "full"):
            raise ValueError(f"lowrank noise needs rank >= 1 and others 'frozen' or 'full', got {spec}")
        params = [(n, p) for n, p in params if p.dim() == 2 or self.others == "full"]
        if not params:
            raise ValueError("lowrank noise found no matrices to perturb in the scope")
        super().__init__(params, spec, restore, master_device)

    @classmethod
    def make_spec(cls, chunk_numel: int = DEFAULT_CHUNK_NUMEL, rank: int = 1, others: str = "frozen", **_) -> dict:
        return {**super().make_spec(chunk_numel), "rank": rank, "others": others}

    def factors(self, seed: int, name: str, shape: torch.Size, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B): (out x r) and (in x r), fp32, from the member seed and the tensor name."""
        out_dim, in_dim = shape
        a = self.noise.full(seed, name + "#A", torch.Size((out_dim, self.rank)), device=device)
        b = self.noise.full(seed, name + "#B", torch.Size((in_dim, self.rank)), device=device)
        return a, b

    def delta(self, coefs: dict[int, float], name: str, p: torch.Tensor) -> torch.Tensor:
        """sum_seed coef * eps_seed for one parameter, fp32, in a fixed order of rank-1 terms."""
        acc = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        if p.dim() == 2:
            inv = self.rank ** -0.5
            for seed, c in coefs.items():
                a, b = self.factors(seed, name, p.shape, p.device)
                for k in range(self.rank):
                    acc.addr_(a[:, k], b[:, k], alpha=c * inv)
        else:
            flat = acc.view(-1)
            for seed, c in coefs.items():
                for s, e, eps in self.noise.chunks(seed, name, flat.numel(), p.device):  # as GaussianNoise
                    flat[s:e].add_(eps, alpha=c)
        return acc

    @torch.no_grad()
    def perturb(self, seed: int, scale: float, upto: int | None = None) -> Iterator[int]:
        for k, (name, p) in enumerate(self.params[:upto]):
            d = self.delta({seed: scale}, name, p)
            if self.masters is not None:
                p.data.copy_(self.masters[k].to(p.device).view(p.shape) + d)
            else:
                p.data.copy_(p.data.float() + d)
            yield k

    @torch.no_grad()
    def combine(self, coefs: dict[int, float]) -> list[torch.Tensor]:
        return [self.delta(coefs, name, p) for name, p in self.params]

    @torch.no_grad()
    def update(self, coefs: dict[int, float], step: float, decay: float = 0.0) -> float:
        sq, count = 0.0, 0
        for k, (name, p) in enumerate(self.params):
            d = self.delta({s: c * step for s, c in coefs.items()}, name, p)
            sq += float(torch.dot(d.view(-1), d.view(-1)))
            count += d.numel()
            target = self.masters[k].view(p.shape) if self.masters is not None else None
            if target is None:
                new = p.data.float()
                if decay:
                    new.mul_(1.0 - decay)
                p.data.copy_(new.add_(d))
                continue
            if decay:
                target.mul_(1.0 - decay)
            target.add_(d.to(target.device))
            p.data.copy_(target.to(p.device))
        return math.sqrt(sq / max(count, 1))


register_perturbation(LowRankNoise)
