"""Tolerances for comparing two computations that are equal in exact arithmetic but round differently: another
summation order (batched against one row at a time, a shared prefix against a plain pass, fused against
unfused attention), another CPU's kernels (AVX2, AVX-512, AMX block a matmul differently), another process.

They derive from the dtype and the operation, never from what one CPU happened to give:

- a reduction of `terms` products computed in two orders lands within Higham's bound gamma_n = n u / (1 - n u)
  (u = eps / 2, the unit roundoff) of the exact sum each, relative to the sum of the terms' magnitudes; two
  computations differ by at most twice that. `depth` reductions in sequence (a network's layers) add up to
  first order. The tolerance is that bound times the output's scale (`max |expected|`), a worst case: the
  typical error is ~sqrt(n) u, so a bug that moves outputs by more than ~1e-3 relative is still caught.
- low-precision kernels (bf16 matmuls on CPU and GPU) accumulate in fp32 and round each output once, so a chain
  of `depth` such ops computed in two orders differs by about one rounding of each: `rounded_chain_rtol`.
- an elementwise update (an optimizer step, adding noise and taking it away) is off by a few units in the last
  place of its operands: `ulps`.

Claims of exactness (ledger replay, restore, the same computation twice) use `torch.equal`, not these.
"""

from __future__ import annotations

import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def reduction_rtol(dtype: torch.dtype, terms: int, depth: int = 1) -> float:
    """How far apart, relative to the result's scale, two orders of computing `depth` chained reductions of
    `terms` terms each may land in `dtype` (no bound once n u >= 1: such sums accumulate in a wider type)."""
    g = terms * unit_roundoff(dtype)
    if g >= 1:
        raise ValueError(f"{terms} terms in {dtype}: n u = {g:.2f} >= 1, no rounding bound; compare in fp32")
    return 2 * depth * g / (1 - g)


def network_rtol(model: torch.nn.Module, dtype: torch.dtype | None = None) -> float:
    """`reduction_rtol` for a transformer's outputs: its longest reduction (the MLP's or the hidden width) in
    each of its layers' two blocks, and the LM head."""
    cfg = model.config
    terms = max(cfg.hidden_size, getattr(cfg, "intermediate_size", 0) or 0)
    dtype = dtype or next(model.parameters()).dtype
    return reduction_rtol(dtype, terms, depth=2 * cfg.num_hidden_layers + 1)


def rounded_chain_rtol(dtype: torch.dtype, depth: int) -> float:
    """How far apart, relative to the result's scale, two orders of computing `depth` chained ops may land when
    each op accumulates in fp32 and rounds its output to `dtype` once (a bf16 forward or backward pass): two
    roundings per op, one in each computation, to first order."""
    return 2 * depth * unit_roundoff(dtype)


def assert_close_up_to_rounding(actual: torch.Tensor, expected: torch.Tensor, rtol: float) -> float:
    """`actual` within `rtol` of `expected`, elementwise and relative to `expected`'s scale (max |expected|:
    an output near zero carries the rounding of the terms that cancelled to give it). Returns the absolute
    tolerance used, so a test can check that what it guards against is larger."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    atol = rtol * scale
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    return atol


def ulps(x: torch.Tensor, count: float = 1.0) -> torch.Tensor:
    """`count` units in the last place of each element of `x`, in x's dtype (the spacing of floats at |x|)."""
    a = x.detach().abs()
    return count * (torch.nextafter(a, torch.full_like(a, float("inf"))) - a)
