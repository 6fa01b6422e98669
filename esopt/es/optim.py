"""Optimisers of the ES gradient estimate: plain SGD (the paper's theta += alpha/G sum w_i eps_i) or Adam on it
(OpenAI-ES, evosax). Adam's moments are a deterministic function of the ledger's lines, so they are never
saved: replay and resume rebuild them by applying every line from generation 0.

Adam, per coordinate, with g = 1/G sum_i w_i eps_i (one generation's ES gradient, sigma folded in as for SGD):
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  theta += alpha * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
Two fp32 copies of the searched parameters (8 bytes per parameter): off the inference-level memory budget, as
for any optimiser state, so it is opt-in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # light to import: ESConfig reads the kinds without loading torch
    import torch

OptimizerKind = Literal["sgd", "adam"]


class AdamState:
    """Adam's moments for a list of flat parameter sizes, updated block by block (`direction`)."""

    def __init__(self, sizes: list[int], beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 device: str | torch.device = "cpu"):
        import torch

        if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and eps > 0):
            raise ValueError(f"adam needs 0 <= beta1, beta2 < 1 and eps > 0, got {beta1}, {beta2}, {eps}")
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = [torch.zeros(n, dtype=torch.float32, device=device) for n in sizes]
        self.v = [torch.zeros(n, dtype=torch.float32, device=device) for n in sizes]
        self.t = 0

    @classmethod
    def from_spec(cls, spec: dict, sizes: list[int], device: str | torch.device = "cpu") -> AdamState:
        return cls(sizes, float(spec["beta1"]), float(spec["beta2"]), float(spec["eps"]), device)

    def begin_step(self) -> None:
        self.t += 1

    def direction(self, k: int, s: int, e: int, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """The step for parameter k's flat [s:e], given its gradient block; updates the moments in place
        (called under the update's no_grad)."""
        m, v = self.m[k][s:e], self.v[k][s:e]
        g = grad.to(m.device)
        m.mul_(self.beta1).add_(g, alpha=1 - self.beta1)
        v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
        m_hat = m / (1 - self.beta1 ** self.t)
        denom = (v / (1 - self.beta2 ** self.t)).sqrt_().add_(self.eps)
        return m_hat.div_(denom).mul_(lr).to(grad.device)


def optimizer_spec(kind: OptimizerKind, beta1: float, beta2: float, eps: float) -> dict | None:
    """What a ledger line records about the optimiser (None for SGD: old ledgers stay valid as they are)."""
    if kind == "sgd":
        return None
    return {"kind": kind, "beta1": beta1, "beta2": beta2, "eps": eps}
