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
- "none": members are never written into the weights (a batched population adds each row's low-rank term in
  the forward pass, `batched.py`), so nothing is restored and no master is kept; updates stay exact fp32
  accumulation. fp32 weights are updated in place (they are their own fp32 value). A bf16 weight keeps the
  low 16 bits of its fp32 value beside it, an int16 tensor on `master_device` (half a master's memory):
  bits(fp32) = bits(bf16) * 2^16 + low, low in [-2^15, 2^15), so the bf16 compute weight is the fp32 value
  rounded to nearest (ties away from zero; the master's copy rounds ties to even, the only difference) and
  the fp32 value is the one an fp32 master would hold, bit for bit (`split_fp32`/`join_bf16`). fp16 weights
  are refused (fp16 is no top half of an fp32): use "exact". A member written into the weights anyway (an
  analysis, a test) is restored exactly from a copy of the weights held only while it is applied (`hold`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch

from esopt.es.kinds import DEFAULT_CHUNK_NUMEL, PERTURBATIONS, perturbation_class
from esopt.es.noise import NoiseSource
from esopt.es.optim import AdamState

Params = Sequence[tuple[str, torch.nn.Parameter]]
RESTORE_MODES = ("exact", "subtract", "none")
_HALF = 1 << 16  # bits(fp32) = bits(bf16) * _HALF + low bits


def split_fp32(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp32 tensor as (bf16, int16 low bits) that hold it exactly: bf16 = value rounded to nearest (ties away
    from zero), bits(value) = bits(bf16) * 2^16 + low. Integer floor division is the arithmetic shift, and no
    step overflows int32 for finite values."""
    bits = value.view(torch.int32)
    high = torch.div(bits, _HALF, rounding_mode="floor")  # the top 16 bits: the value truncated to bf16
    low = bits - high * _HALF  # in [0, 2^16)
    up = (low >= _HALF // 2).to(torch.int32)  # past half a bf16 ulp: round the magnitude up, carry a negative rest
    return (high + up).to(torch.int16).view(torch.bfloat16), (low - up * _HALF).to(torch.int16)


def join_bf16(weights: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The fp32 tensor `split_fp32` split into bf16 `weights` and `low` bits (a new tensor)."""
    return (weights.view(torch.int16).to(torch.int32) * _HALF + low.to(torch.int32)).view(torch.float32)


def low_bits_for(p: torch.Tensor, name: str, device: str) -> torch.Tensor | None:
    """Restore "none": what exact fp32 accumulation needs beside weight `p` (None: fp32 weights need nothing)."""
    if p.dtype == torch.float32:
        return None
    if p.dtype == torch.bfloat16:
        return torch.zeros(p.numel(), dtype=torch.int16, device=device)  # a bf16 weight is an fp32 value exactly
    raise ValueError(f"restore 'none' keeps exact fp32 values of fp32 and bf16 weights only; {name} is {p.dtype} "
                     "(use restore: exact)")


class Perturbation:
    """Seeded noise over a fixed list of (name, parameter): perturb, restore, update.

    Subclasses set `dist` (the spec's name for the kind) and `version` (bumped whenever the numbers a
    spec produces change, so an old ledger is refused instead of replayed wrongly)."""

    dist: ClassVar[str] = ""
    version: ClassVar[int] = 1

    def __init__(self, params: Params, spec: dict, restore: str = "exact", master_device: str = "cpu"):
        restore = "exact" if restore == "auto" else restore  # ESConfig's default; a batched run resolves it to none
        if restore not in RESTORE_MODES:
            raise ValueError(f"restore must be one of {RESTORE_MODES}, got {restore!r}")
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
        self.low_bits: list[torch.Tensor | None] | None = None  # restore "none" (see the module docstring)
        self.held: list[torch.Tensor] | None = None  # restore "none": the weights while a member is applied
        self.optimizer: AdamState | None = None  # a stateful optimiser of the ES gradient (`apply_record`)
        self.master_device = master_device
        if restore == "exact":
            self.masters = [p.detach().to(master_device, torch.float32, copy=True).view(-1) for _, p in self.params]
        elif restore == "none":
            self.low_bits = [low_bits_for(p, name, master_device) for name, p in self.params]

    @classmethod
    def make_spec(cls, chunk_numel: int = DEFAULT_CHUNK_NUMEL, **options) -> dict:
        """The ledger's description of this kind; `options` are kind-specific (lowrank: rank, others)."""
        return {"version": cls.version, "dist": cls.dist, "dtype": "float32", "chunk_numel": chunk_numel}

    @property
    def numel(self) -> int:
        return sum(p.numel() for _, p in self.params)

    @property
    def searched_dimension(self) -> int:
        """D: how many coordinates the updates of a run can move (all perturbed elements, unless a kind
        confines them to a subspace)."""
        return self.numel

    def perturb(self, seed: int, scale: float, upto: int | None = None) -> Iterator[int]:
        """theta_k += scale * eps_k for the first `upto` tensors; yields k after each one is done."""
        raise NotImplementedError

    @torch.no_grad()
    def restore(self, seed: int, scale: float, upto: int | None = None) -> None:
        """Undo perturb(seed, scale) on the first `upto` tensors (all by default): copy the fp32 master back
        (exact), the weights `hold` copied (none), or perturb by -scale (subtract mode)."""
        if self.held is not None:  # restore "none": the weights as they were before the member
            for (_, p), h in zip(self.params, self.held):
                p.data.view(-1).copy_(h)
            self.held = None
            return
        if self.masters is None:
            for _ in self.perturb(seed, -scale, upto):
                pass
            return
        for (_, p), m in zip(self.params[:upto], self.masters):
            p.data.view(-1).copy_(m)

    def blocks(self, coefs: dict[int, float], name: str, p: torch.Tensor) -> Iterator[tuple[int, int, torch.Tensor]]:
        """sum_seed coef * eps_seed for one parameter as (start, end, fp32 flat block), one noise chunk at a time,
        seeds summed in the order given (dense Gaussian noise; kinds with other noise override this)."""
        for j, s, e in self.noise.bounds(p.numel()):
            acc = torch.zeros(e - s, dtype=torch.float32, device=p.device)
            for seed, c in coefs.items():
                acc.add_(self.noise.chunk(seed, name, j, e - s, p.device), alpha=c)
            yield s, e, acc

    @torch.no_grad()
    def update(self, coefs: dict[int, float], step: float, decay: float = 0.0, lr: float | None = None) -> float:
        """theta = theta * (1 - decay) + step * sum_seed coef_seed * eps_seed; returns the change's RMS.
        With an optimiser (Adam), step * sum coef eps is its gradient and `lr` its learning rate instead.
        Accumulated in fp32 block by block, so training and replay do identical floating-point operations
        (bit-exact replay in fp32) and no step holds a full-size delta."""
        sq, count = 0.0, 0
        scaled = {seed: c * step for seed, c in coefs.items()}
        if self.optimizer is not None:
            self.optimizer.begin_step()
        for k, (name, p) in enumerate(self.params):
            flat = p.data.view(-1)
            for s, e, d in self.blocks(scaled, name, p):
                if self.optimizer is not None:
                    d = self.optimizer.direction(k, s, e, d, step if lr is None else lr)
                sq += float(torch.dot(d, d))
                count += e - s
                value = self.exact_value(k, s, e)
                if value is None:  # subtract mode, non-fp32 weights
                    self.rounded_update(flat[s:e], d, decay)
                    continue
                if decay:
                    value.mul_(1.0 - decay)
                value.add_(d.to(value.device))
                self.keep(k, s, value)
            if self.masters is not None:
                flat.copy_(self.masters[k].to(p.device))
        return math.sqrt(sq / max(count, 1))

    @staticmethod
    def rounded_update(chunk: torch.Tensor, acc: torch.Tensor, decay: float) -> None:
        """Subtract mode's update of non-fp32 weights: decayed in their dtype, the fp32 step added, rounded."""
        if decay:
            chunk.mul_(1.0 - decay)
        chunk.copy_(chunk.float().add_(acc))

    @torch.no_grad()
    def hold(self) -> None:
        """Before an in-place member: restore "none" copies the weights (their dtype, on `master_device`) until
        `restore` puts them back, so the member is undone exactly; a batched population never calls this."""
        if self.restore_mode == "none":
            self.held = [p.detach().to(self.master_device, copy=True).view(-1) for _, p in self.params]

    def exact_value(self, k: int, s: int = 0, e: int | None = None) -> torch.Tensor | None:
        """The fp32 value of parameter k's flat [s:e] that an update accumulates into: a view of its master,
        of fp32 weights themselves, or (restore "none", bf16) the weights joined with their low bits, a new
        tensor that `keep` writes back. None: subtract mode's non-fp32 weights, updated in their own dtype."""
        flat = self.params[k][1].data.view(-1)
        if self.masters is not None:
            return self.masters[k][s:e]
        low = self.low_bits[k] if self.low_bits is not None else None
        if low is not None:
            return join_bf16(flat[s:e], low[s:e].to(flat.device))
        return flat[s:e] if flat.dtype == torch.float32 else None

    def keep(self, k: int, s: int, value: torch.Tensor) -> None:
        """Restore "none", bf16: split the fp32 `value` an update left in `exact_value(k, s, ...)` back into the
        weights and their low bits. Nothing to do otherwise: fp32 weights were updated in place, and the caller
        copies a master into the weights (rounded) once the whole tensor is updated."""
        low = self.low_bits[k] if self.low_bits is not None else None
        if low is not None:
            weights, rest = split_fp32(value)
            self.params[k][1].data.view(-1)[s:s + value.numel()].copy_(weights)
            low[s:s + value.numel()].copy_(rest)

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
    def member_weights(self, k: int, members: Sequence[tuple[int, float]]) -> torch.Tensor:
        """Parameter k as each (seed, scale) member has it, stacked (G, *shape) in the weights' dtype; the weights
        stay untouched (a batched full-rank population runs each row on its member's copy). Built from the
        parameter's exact fp32 value where one is kept (the master, or bf16 weights joined with their low bits:
        the values an in-place member writes from an fp32 master), else from the weights. Chunk by chunk: the
        base moves to the device once and each seed's noise is drawn once (an antithetic pair shares it)."""
        name, p = self.params[k]
        out = torch.empty((len(members), p.numel()), dtype=p.dtype, device=p.device)
        for j, s, e in self.noise.bounds(p.numel()):
            base = self.exact_value(k, s, e)
            base = p.data.view(-1)[s:e].float() if base is None else base.to(p.device)
            for seed in dict.fromkeys(seed for seed, _ in members):
                eps = self.draw(seed, name, j, e - s, p.device)
                for i, (other, scale) in enumerate(members):
                    if other == seed:
                        out[i, s:e].copy_(torch.add(base, eps, alpha=scale))
        return out.view(len(members), *p.shape)

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
    """Apply one generation's update from its ledger line (used by tell, replay and replica sync). A line with
    an `optimizer` (Adam) updates the optimiser state `perturbation` carries from line to line, so lines must
    be applied in order from generation 0 on one perturbation."""
    if record["alpha"] <= 0:
        return 0.0
    decay = record["alpha"] * record["weight_decay"]
    spec = record.get("optimizer")
    if spec is None:
        return perturbation.update(update_coefficients(record), record["alpha"] / record["population_size"], decay)
    if spec["kind"] != "adam":
        raise ValueError(f"unknown optimizer {spec['kind']!r} in ledger line {record['generation']}")
    if perturbation.optimizer is None:
        if record["generation"] != 0:
            raise ValueError(f"an Adam run's ledger must be applied from generation 0 (its moments are rebuilt "
                             f"from every line), got line {record['generation']} first")
        perturbation.optimizer = AdamState.from_spec(spec, [p.numel() for _, p in perturbation.params],
                                                     perturbation.master_device)
    return perturbation.update(update_coefficients(record), 1.0 / record["population_size"], decay,
                               lr=record["alpha"])


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

    def blocks(self, coefs: dict[int, float], name: str, p: torch.Tensor) -> Iterator[tuple[int, int, torch.Tensor]]:
        """sum_seed coef * eps_seed for one parameter as (start, end, fp32 flat block), in blocks of whole rows
        of about `chunk_numel` elements, so no step holds a full-size delta (the tied embedding's is 113 MB).
        Every element gets the same operations in the same order as in one full-size accumulation."""
        if p.dim() != 2:  # others: full
            yield from super().blocks(coefs, name, p)
            return
        out_dim, in_dim = p.shape
        inv = self.rank ** -0.5
        terms = [(c * inv, *self.factors(seed, name, p.shape, p.device)) for seed, c in coefs.items()]
        rows = max(1, self.noise.chunk_numel // in_dim)
        for r0 in range(0, out_dim, rows):
            r1 = min(r0 + rows, out_dim)
            acc = torch.zeros((r1 - r0, in_dim), dtype=torch.float32, device=p.device)
            for alpha, a, b in terms:
                for k in range(self.rank):
                    acc.addr_(a[r0:r1, k], b[:, k], alpha=alpha)
            yield r0 * in_dim, r1 * in_dim, acc.view(-1)

    def delta(self, coefs: dict[int, float], name: str, p: torch.Tensor) -> torch.Tensor:
        """sum_seed coef * eps_seed for one parameter as one fp32 tensor (analyses; allocates it whole)."""
        out = torch.empty(p.numel(), dtype=torch.float32, device=p.device)
        for s, e, block in self.blocks(coefs, name, p):
            out[s:e] = block
        return out.view(p.shape)

    @torch.no_grad()
    def perturb(self, seed: int, scale: float, upto: int | None = None) -> Iterator[int]:
        for k, (name, p) in enumerate(self.params[:upto]):
            flat = p.data.view(-1)
            for s, e, d in self.blocks({seed: scale}, name, p):
                base = self.masters[k][s:e].to(p.device) if self.masters is not None else flat[s:e].float()
                flat[s:e].copy_(base + d)
            yield k

    @torch.no_grad()
    def combine(self, coefs: dict[int, float]) -> list[torch.Tensor]:
        return [self.delta(coefs, name, p) for name, p in self.params]

    @staticmethod
    def rounded_update(chunk: torch.Tensor, acc: torch.Tensor, decay: float) -> None:
        """Subtract mode's update of non-fp32 weights: decayed in fp32 with the step, rounded once."""
        new = chunk.float()
        if decay:
            new.mul_(1.0 - decay)
        chunk.copy_(new.add_(acc))


register_perturbation(LowRankNoise)


class SubspaceNoise(LowRankNoise):
    """LoRA-shaped subspace: member i perturbs a matrix W (out x in) by sigma * A0 B_i^T / sqrt(r), where A0
    (out x r) is fixed for the whole run (drawn from `basis_seed` and the tensor name) and only B_i (in x r)
    comes from the member's seed. ES then searches the r * in coordinates of B, as LoRA with A frozen does:
    the searched dimension D is sum(r * in) over the matrices (~1.5e5 for SmolLM2 at r = 1, against 1.3e8
    for dense noise), and every update stays in the span of A0, so the run's total change has rank <= r per
    matrix. Each element of A0 B^T / sqrt(r) has unit variance, as dense noise has, so sigma means the same.
    Batched populations run it like `lowrank` (the same factors interface)."""

    dist = "subspace"
    version = 1
    BASIS_SEED = 0x5EED5

    def __init__(self, params: Params, spec: dict, restore: str = "exact", master_device: str = "cpu"):
        super().__init__(params, spec, restore, master_device)
        self.basis_seed = int(spec.get("basis_seed", self.BASIS_SEED))
        self._bases: dict[tuple[str, torch.device], torch.Tensor] = {}

    @classmethod
    def make_spec(cls, chunk_numel: int = DEFAULT_CHUNK_NUMEL, rank: int = 1, others: str = "frozen", **_) -> dict:
        return {**super().make_spec(chunk_numel, rank, others), "basis_seed": cls.BASIS_SEED}

    @property
    def searched_dimension(self) -> int:
        return sum(self.rank * p.shape[1] if p.dim() == 2 else p.numel() for _, p in self.params)

    def factors(self, seed: int, name: str, shape: torch.Size, device) -> tuple[torch.Tensor, torch.Tensor]:
        out_dim, in_dim = shape
        key = (name, torch.device(device))
        if key not in self._bases:  # fixed for the run: drawn once per tensor
            self._bases[key] = self.noise.full(self.basis_seed, name + "#A0", torch.Size((out_dim, self.rank)),
                                               device=device)
        b = self.noise.full(seed, name + "#B", torch.Size((in_dim, self.rank)), device=device)
        return self._bases[key], b


register_perturbation(SubspaceNoise)
