"""Many members in one batched forward: the base weights stay untouched and each batch row computes with its
own member's weights. `member_router` picks the kind for the noise:

- `BatchedLowRank` (EGGROLL). For a linear layer y = x W^T, member i's weight is W + s_i A_i B_i^T (s_i = sigma *
  sign_i / sqrt(r)), so its output is y + s_i (x B_i) A_i^T: two thin matmuls per row instead of a perturbed
  copy of W. For an embedding the row of token t gains s_i A_i[t] B_i^T. A tied LM head shares the embedding's
  factors. With G members x E episodes in one batch, the CPU's AMX units and a GPU see batches G times larger
  than one member's rollout: that is where the throughput comes from.
- `BatchedFullRank` (dense noise). Each member's perturbed copy of every parameter is built once per block, and
  each row runs its Linear, Embedding and RMSNorm layers with its member's copy (one bmm per Linear when the
  rows come in member blocks). It holds a perturbed copy of the model per member of the block
  (`es.members_per_rollout` bounds that). It pays where one member's decode is launch-bound (a GPU decoding a
  few rows) and not where decode is bandwidth-bound (a CPU reads every member's copy either way).

    host = member_router(model, es.perturbation)
    with host.members(members, sigma):
        host.set_rows([0, 0, 1, 1, ...])      # which member each batch row belongs to
        model(input_ids)                      # rows see their own member's weights
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from esopt.es.perturbation import GaussianNoise, LowRankNoise, Perturbation


def weight_owners(model: torch.nn.Module, serves) -> dict[int, list[tuple[str, torch.nn.Module]]]:
    """id(weight) -> the (name, module)s a batched kind `serves` that use it (a tied LM head shares the
    embedding's weight: both are listed)."""
    owners: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in model.named_modules():
        if serves(module):
            owners.setdefault(id(module.weight), []).append((name, module))
    return owners


class BatchedLowRank:
    def __init__(self, model: torch.nn.Module, perturbation: LowRankNoise):
        if not isinstance(perturbation, LowRankNoise):
            raise ValueError("batched populations need es.noise: lowrank")
        if any(p.dim() != 2 for _, p in perturbation.params):
            raise ValueError("batched populations need es.noise_others: frozen (dense noise cannot be batched)")
        self.model, self.perturbation = model, perturbation
        owners = weight_owners(model, lambda m: isinstance(m, (torch.nn.Linear, torch.nn.Embedding)))
        self.targets: list[tuple[str, torch.nn.Module]] = []
        for name, p in perturbation.params:
            if id(p) not in owners:
                raise ValueError(f"batched low-rank noise supports Linear and Embedding weights only; {name} is "
                                 "neither (narrow es.scope, or evaluate members one by one)")
            self.targets += [(name, m) for _, m in owners[id(p)]]
        self.rows: torch.Tensor | None = None
        # per matrix, members stacked: A (G, r, out), B (G, in, r); and each member's scale sigma*sign/sqrt(r)
        self.factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.scales: torch.Tensor | None = None
        # the rows' members as blocks: (members in row order (M,), rows per member k) when the rows are k
        # consecutive rows of each member (a rollout's first turns, the prefix passes), else None
        self.blocks: tuple[torch.Tensor, int] | None = None
        self.in_order = False
        self.row_factors: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self.row_scales: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # (N, 1, 1) per device, dtype

    def set_rows(self, members_of_rows: Sequence[int]) -> None:
        """The member index (position in the `members` list) of every row of the next forward passes."""
        rows = list(members_of_rows)
        self.rows = torch.as_tensor(rows, dtype=torch.long)
        self.blocks = _blocks(rows)
        # every member once per block, in order: the stacked factors serve as they are
        self.in_order = self.blocks is not None and self.scales is not None and \
            self.blocks[0].tolist() == list(range(len(self.scales)))
        self.row_factors, self.row_scales = {}, {}  # gathered again lazily, once for all passes over these rows

    @contextlib.contextmanager
    def members(self, members: Sequence, sigma: float) -> Iterator[BatchedLowRank]:
        """Install the members' factors for the block; the model is unchanged before and after."""
        pert, r = self.perturbation, self.perturbation.rank
        self.scales = torch.tensor([sigma * m.sign * r ** -0.5 for m in members], dtype=torch.float32)
        for name, p in pert.params:
            pairs = [pert.factors(m.seed, name, p.shape, p.device) for m in members]
            a = torch.stack([x.T for x, _ in pairs])  # (G, r, out)
            b = torch.stack([y for _, y in pairs])  # (G, in, r)
            self.factors[name] = (a.to(p.dtype), b.to(p.dtype))
        handles = [module.register_forward_hook(self._hook(name)) for name, module in self.targets]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self.factors, self.scales, self.rows, self.blocks, self.row_factors = {}, None, None, None, {}
            self.row_scales = {}
            self.in_order = False

    def _factors_of(self, name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(A (N, r, out), B (N, in, r), scales (N, 1, 1), rows per entry k) for the current rows: per member
        when the rows come in blocks (no copy when every member is there, in order), else per row (gathered once
        per `set_rows`). Blocks keep memory at the members' factors: per-row copies of every matrix's factors
        for 128 rows were 182 MB of SmolLM2, more than the members' own (45 MB for 32)."""
        if self.rows is None or self.scales is None:
            raise RuntimeError("BatchedLowRank: a forward pass outside members() or before set_rows()")
        a, b = self.factors[name]
        which, k = self.blocks if self.blocks is not None else (self.rows, 1)
        if (device, a.dtype) not in self.row_scales:
            self.row_scales[device, a.dtype] = self.scales.to(device, a.dtype)[which.to(device)][:, None, None]
        scales = self.row_scales[device, a.dtype]
        if self.in_order:
            return a.to(device), b.to(device), scales, k
        if (name, device) not in self.row_factors:
            index = which.to(a.device)
            self.row_factors[name, device] = (a[index].to(device), b[index].to(device))
        return (*self.row_factors[name, device], scales, k)

    def _hook(self, name: str):
        def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            if self.rows is None:
                raise RuntimeError("BatchedLowRank: set_rows() before the forward pass")
            n = len(self.rows)
            if output.shape[0] != n:
                raise RuntimeError(f"BatchedLowRank: a batch of {output.shape[0]} rows, but rows were set for {n}")
            a, b, scales, k = self._factors_of(name, output.device)
            groups = n // k  # rows of one entry are consecutive: (n, T, .) -> (groups, k*T, .) is a view
            x = inputs[0]
            out = output.reshape(groups, -1, output.shape[-1])
            if isinstance(module, torch.nn.Embedding):  # row t of W gains A[t] B^T
                r = a.shape[1]
                ids = x.reshape(groups, -1)
                coef = torch.gather(a, 2, ids[:, None, :].expand(groups, r, ids.shape[1])).transpose(1, 2)  # (N, kT, r)
                return out.baddbmm_(coef * scales, b.transpose(1, 2)).view_as(output)
            # Linear y = x W^T gains s (x B) A^T, added in place: the output is a fresh tensor (inference only)
            return out.baddbmm_(torch.bmm(x.reshape(groups, -1, x.shape[-1]), b) * scales, a).view_as(output)

        return hook


def _is_rmsnorm(module: torch.nn.Module) -> bool:
    """Llama-style RMSNorm (Llama, Qwen, Mistral, SmolLM2): weight * x / rms(x), computed in fp32."""
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


def _rms_normed(module: Any, x: torch.Tensor) -> torch.Tensor:
    h = x.to(torch.float32)  # LlamaRMSNorm.forward without its weight
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)).to(x.dtype)


def _with_weight(module: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What `module` computes on `x` with `w` in place of its weight; `w` may carry a leading member axis G over
    x's G row blocks (x: (G*k, ...))."""
    if w.dim() == module.weight.dim():
        if isinstance(module, torch.nn.Embedding):
            return F.embedding(x, w, module.padding_idx)
        if isinstance(module, torch.nn.Linear):
            return F.linear(x, w, module.bias)
        return w * _rms_normed(module, x)
    g = w.shape[0]  # every member's rows in turn: one batched op
    if isinstance(module, torch.nn.Embedding):  # member m's rows index rows [m*V, (m+1)*V) of the stacked tables
        vocab = w.shape[1]
        offset = torch.arange(g, device=x.device).view(g, 1) * vocab
        return F.embedding((x.reshape(g, -1) + offset).view_as(x), w.reshape(-1, w.shape[-1]))
    if isinstance(module, torch.nn.Linear):
        xs = x.reshape(g, -1, x.shape[-1])
        out = torch.bmm(xs, w.transpose(1, 2)) if module.bias is None else \
            torch.baddbmm(module.bias.expand(g, 1, -1), xs, w.transpose(1, 2))
        return out.view(*x.shape[:-1], w.shape[1])
    normed = _rms_normed(module, x)
    return (w.unsqueeze(1) * normed.reshape(g, -1, normed.shape[-1])).view_as(normed)


def _check_layer(name: str, module: Any) -> None:
    """Refuse a layer whose own forward is not what `_with_weight` computes (a subclass that scales its output,
    an RMSNorm of another formula): its rows would silently run another function."""
    w = module.weight
    with torch.no_grad():
        if isinstance(module, torch.nn.Embedding):
            x = torch.arange(min(3, module.num_embeddings), device=w.device).view(1, -1)
        else:
            x = torch.randn(1, 3, w.shape[-1], generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype)
        same = torch.equal(module(x), _with_weight(module, x, w))
    if not same:
        raise ValueError(f"batched full-rank noise: {name} ({type(module).__name__}) does not compute what a plain "
                         "Linear, Embedding or Llama RMSNorm does; evaluate members one by one (es.batched: false)")


class BatchedFullRank:
    def __init__(self, model: torch.nn.Module, perturbation: Perturbation):
        if not isinstance(perturbation, GaussianNoise):
            raise ValueError("batched full-rank populations need es.noise: normal")
        owners = weight_owners(model, lambda m: isinstance(m, (torch.nn.Linear, torch.nn.Embedding))
                               or _is_rmsnorm(m))
        self.targets: list[tuple[int, torch.nn.Module]] = []
        for k, (name, p) in enumerate(perturbation.params):
            if id(p) not in owners:
                raise ValueError(f"batched full-rank noise serves the weights of Linear, Embedding and RMSNorm layers; "
                                 f"{name} is none of those (narrow es.scope, or evaluate members one by one)")
            for mname, module in owners[id(p)]:
                _check_layer(mname, module)
                self.targets.append((k, module))
        self.model, self.perturbation = model, perturbation
        self.weights: dict[int, torch.Tensor] = {}  # parameter k -> (G, *shape): the block's members' copies
        self.rows: list[int] | None = None
        self.in_order = False  # rows are each member's k rows in turn, every member there: one op per layer
        self.groups: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}  # per device: (member, its rows)

    def set_rows(self, members_of_rows: Sequence[int]) -> None:
        """The member index (position in the `members` list) of every row of the next forward passes."""
        self.rows = list(members_of_rows)
        blocks = _blocks(self.rows)
        self.in_order = blocks is not None and blocks[0].tolist() == list(range(self._members()))
        self.groups = {}  # built on the first pass that needs them, once for all passes over these rows

    def _groups(self, device: torch.device) -> list[tuple[int, torch.Tensor]]:
        if device not in self.groups:
            assert self.rows is not None
            own: dict[int, list[int]] = {}
            for i, m in enumerate(self.rows):
                own.setdefault(m, []).append(i)
            self.groups[device] = [(m, torch.tensor(idx, device=device)) for m, idx in own.items()]
        return self.groups[device]

    def _members(self) -> int:
        return next(iter(self.weights.values())).shape[0] if self.weights else 0

    @contextlib.contextmanager
    def members(self, members: Sequence, sigma: float) -> Iterator[BatchedFullRank]:
        """Build the members' perturbed copies for the block; the model is unchanged before and after."""
        pert = self.perturbation
        assert isinstance(pert, GaussianNoise)
        scaled = [(m.seed, sigma * m.sign) for m in members]
        for k in range(len(pert.params)):
            self.weights[k] = pert.member_weights(k, scaled)
        # each target's forward replaced for the block (an instance attribute over the class's method, or over
        # one set before, e.g. by accelerate), so the base weights' product is not computed only to be discarded
        own = [module.__dict__.get("forward") for _, module in self.targets]
        for k, module in self.targets:
            module.forward = self._forward(k, module)
        try:
            yield self
        finally:
            for (_, module), before in zip(self.targets, own):
                if before is None:
                    del module.forward
                else:
                    module.forward = before
            self.weights, self.rows, self.in_order, self.groups = {}, None, False, {}

    def _forward(self, k: int, module: torch.nn.Module):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if self.rows is None:
                raise RuntimeError("BatchedFullRank: set_rows() before the forward pass")
            if x.shape[0] != len(self.rows):
                raise RuntimeError(f"BatchedFullRank: a batch of {x.shape[0]} rows, but rows were set for "
                                   f"{len(self.rows)}")
            w = self.weights[k]
            if self.in_order:
                return _with_weight(module, x, w)
            out: torch.Tensor | None = None
            for m, idx in self._groups(x.device):  # member by member
                y = _with_weight(module, x[idx], w[m])
                if out is None:
                    out = y.new_empty((x.shape[0], *y.shape[1:]))
                out[idx] = y
            assert out is not None
            return out

        return forward


def member_router(model: torch.nn.Module, perturbation: Perturbation) -> BatchedLowRank | BatchedFullRank:
    """The batched population for this noise: low-rank factors added per row, or dense per-member copies."""
    if isinstance(perturbation, LowRankNoise):
        return BatchedLowRank(model, perturbation)
    return BatchedFullRank(model, perturbation)


def _blocks(rows: list[int]) -> tuple[torch.Tensor, int] | None:
    """(the members in row order, k) when `rows` is each of those members k times in a row, else None."""
    if not rows:
        return None
    members = [rows[0]]
    for prev, cur in zip(rows, rows[1:]):
        if cur != prev:
            members.append(cur)
    k = len(rows) // len(members)
    if len(set(members)) != len(members) or k * len(members) != len(rows) or \
            any(rows[i] != members[i // k] for i in range(len(rows))):
        return None
    return torch.tensor(members, dtype=torch.long), k
