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
        self.factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.masks: dict[torch.device, torch.Tensor] = {}

    def set_rows(self, members_of_rows: Sequence[int]) -> None:
        """The member index (position in the `members` list) of every row of the next forward passes."""
        self.rows = torch.as_tensor(list(members_of_rows), dtype=torch.long)

    @contextlib.contextmanager
    def members(self, members: Sequence, sigma: float) -> Iterator[BatchedLowRank]:
        """Install the members' factors for the block; the model is unchanged before and after.

        Per matrix, the members' factors are concatenated: A_cat (out x G*r) and B_cat (in x G*r). A row of
        member i then computes ((x B_cat) * M_i) A_cat^T, where the mask M_i keeps member i's r columns and
        carries its scale: two dense matmuls with G*r inner columns, instead of G thin ones."""
        pert, g, r = self.perturbation, len(members), self.perturbation.rank
        mask = torch.zeros(g, g * r, dtype=torch.float32)
        for i, m in enumerate(members):
            mask[i, i * r:(i + 1) * r] = sigma * m.sign * r ** -0.5
        for name, p in pert.params:
            pairs = [pert.factors(m.seed, name, p.shape, p.device) for m in members]
            a = torch.cat([x for x, _ in pairs], dim=1)  # (out, G*r)
            b = torch.cat([y for _, y in pairs], dim=1)  # (in, G*r)
            self.factors[name] = (a.to(p.dtype), b.to(p.dtype))
            if p.device not in self.masks:
                self.masks[p.device] = mask.to(p.device, p.dtype)
        handles = [module.register_forward_hook(self._hook(name)) for name, module in self.targets]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self.factors, self.masks, self.rows = {}, {}, None

    def _hook(self, name: str):
        def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            if self.rows is None:
                raise RuntimeError("BatchedLowRank: set_rows() before the forward pass")
            if output.shape[0] != len(self.rows):
                raise RuntimeError(f"BatchedLowRank: a batch of {output.shape[0]} rows, but rows were set for "
                                   f"{len(self.rows)}")
            a, b = self.factors[name]
            mask = self.masks[output.device][self.rows.to(output.device)][:, None, :]  # (R, 1, G*r)
            x = inputs[0]
            if isinstance(module, torch.nn.Embedding):  # row t of W gains A[t] B^T
                coef = a[x.reshape(len(self.rows), -1)] * mask  # (R, T, G*r)
                return output + (coef @ b.T).view_as(output)
            xb = x.reshape(len(self.rows), -1, x.shape[-1]) @ b  # (R, T, G*r); Linear y = x W^T gains (x B) A^T
            return output + ((xb * mask) @ a.T).view_as(output)

        return hook
