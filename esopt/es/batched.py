"""Many low-rank members in one batched forward (EGGROLL): the base weights stay untouched and each batch row
adds its own member's term.

For a linear layer y = x W^T, member i's weight is W + s_i A_i B_i^T (s_i = sigma * sign_i / sqrt(r)), so
its output is y + s_i (x B_i) A_i^T: two thin matmuls per row instead of a perturbed copy of W. For an
embedding the row of token t gains s_i A_i[t] B_i^T. A tied LM head shares the embedding's factors.
With G members x E episodes in one batch, the CPU's AMX units and a GPU see batches G times larger than
one member's rollout: that is where the throughput comes from.

    host = BatchedLowRank(model, es.perturbation)
    with host.members(members, sigma):
        host.set_rows([0, 0, 1, 1, ...])      # which member each batch row belongs to
        model(input_ids)                      # rows see their own member's weights
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from esopt.es.perturbation import LowRankNoise


class BatchedLowRank:
    def __init__(self, model: torch.nn.Module, perturbation: LowRankNoise):
        if not isinstance(perturbation, LowRankNoise):
            raise ValueError("batched populations need es.noise: lowrank")
        if any(p.dim() != 2 for _, p in perturbation.params):
            raise ValueError("batched populations need es.noise_others: frozen (dense noise cannot be batched)")
        self.model, self.perturbation = model, perturbation
        owners: dict[int, list[torch.nn.Module]] = {}
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                owners.setdefault(id(module.weight), []).append(module)
        self.targets: list[tuple[str, torch.nn.Module]] = []
        for name, p in perturbation.params:
            if id(p) not in owners:
                raise ValueError(f"batched low-rank noise supports Linear and Embedding weights only; {name} is "
                                 "neither (narrow es.scope, or evaluate members one by one)")
            self.targets += [(name, m) for m in owners[id(p)]]
        self.rows: torch.Tensor | None = None
        # per matrix, members stacked: A (G, r, out), B (G, in, r); and each member's scale sigma*sign/sqrt(r)
        self.factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.scales: torch.Tensor | None = None
        self.row_factors: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def set_rows(self, members_of_rows: Sequence[int]) -> None:
        """The member index (position in the `members` list) of every row of the next forward passes."""
        self.rows = torch.as_tensor(list(members_of_rows), dtype=torch.long)
        self.row_factors = {}  # gathered again lazily, once per matrix for all passes over these rows

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
            self.factors, self.scales, self.rows, self.row_factors = {}, None, None, {}

    def _rows_of(self, name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's own scaled A (R, r, out) and B (R, in, r), gathered once per `set_rows`: the member's
        scale sigma*sign/sqrt(r) is folded into A here, so a forward pays two thin matmuls and nothing else."""
        key = (name, device)
        if key not in self.row_factors:
            if self.rows is None or self.scales is None:
                raise RuntimeError("BatchedLowRank: a forward pass outside members() or before set_rows()")
            a, b = self.factors[name]
            rows = self.rows.to(a.device)
            scale = self.scales.to(a.device, a.dtype)[rows][:, None, None]
            self.row_factors[key] = ((a[rows] * scale).to(device), b[rows].to(device))
        return self.row_factors[key]

    def _hook(self, name: str):
        def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            if self.rows is None:
                raise RuntimeError("BatchedLowRank: set_rows() before the forward pass")
            n = len(self.rows)
            if output.shape[0] != n:
                raise RuntimeError(f"BatchedLowRank: a batch of {output.shape[0]} rows, but rows were set for {n}")
            a, b = self._rows_of(name, output.device)
            x = inputs[0]
            out = output.view(n, -1, output.shape[-1])
            if isinstance(module, torch.nn.Embedding):  # row t of W gains A[t] B^T
                r = a.shape[1]
                ids = x.reshape(n, -1)
                coef = torch.gather(a, 2, ids[:, None, :].expand(n, r, ids.shape[1])).transpose(1, 2)  # (R, T, r)
                return out.baddbmm_(coef, b.transpose(1, 2)).view_as(output)
            # Linear y = x W^T gains (x B) A^T, added in place: the output is a fresh tensor (inference only)
            return out.baddbmm_(torch.bmm(x.reshape(n, -1, x.shape[-1]), b), a).view_as(output)

        return hook
