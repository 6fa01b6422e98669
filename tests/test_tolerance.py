"""The tolerance helper's bounds hold for real reorderings and are no looser than their derivation says."""

import torch

from tests.tolerance import assert_close_up_to_rounding, network_rtol, reduction_rtol, rounded_chain_rtol, ulps


def test_two_summation_orders_land_within_the_reduction_bound():
    g = torch.Generator().manual_seed(0)
    for dtype, terms in ((torch.float32, 512), (torch.bfloat16, 64)):  # bf16: n u < 1 only up to 255 terms
        x = torch.randn(64, terms, generator=g).to(dtype)
        forward = x.sum(1, dtype=dtype)
        perm = torch.randperm(terms, generator=g)
        shuffled = torch.zeros(64, dtype=dtype)
        for k in perm:  # one term at a time, in another order: the worst kind of reordering
            shuffled = shuffled + x[:, k]
        scale = x.float().abs().sum(1)  # the bound is relative to the sum of the terms' magnitudes
        assert ((forward.float() - shuffled.float()).abs() <= reduction_rtol(dtype, terms) * scale).all()
        assert (forward != shuffled).any()  # they do round apart: the bound is not vacuous here


def test_the_bounds_scale_with_dtype_terms_and_depth():
    assert reduction_rtol(torch.bfloat16, 8) / reduction_rtol(torch.float32, 8) > 6e4  # 2^-8 against 2^-24
    assert reduction_rtol(torch.float32, 8, depth=3) == 3 * reduction_rtol(torch.float32, 8)
    from esopt.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=0)  # 4 layers, MLP 512: 9 chained reductions of 512 terms
    assert network_rtol(model) == reduction_rtol(torch.float32, 512, depth=9)
    assert network_rtol(model) < 1e-3  # still catches an error of a thousandth of the outputs' scale
    import pytest

    with pytest.raises(ValueError, match="no rounding bound"):
        reduction_rtol(torch.bfloat16, 512)


def test_assert_close_up_to_rounding_fails_past_the_bound_and_ulps_are_the_float_spacing():
    import pytest

    x = torch.tensor([1.0, -2.0, 0.5])
    atol = assert_close_up_to_rounding(x + 1e-7, x, 1e-6)
    assert atol == pytest.approx(2e-6)
    with pytest.raises(AssertionError):
        assert_close_up_to_rounding(x + 1e-4, x, 1e-6)
    assert ulps(torch.tensor([1.0, 0.2, 4.0])).tolist() == [2**-23, 2**-26, 2**-21]


def test_a_bf16_chain_in_two_orders_lands_within_the_rounded_chain_bound():
    """bf16 matmuls accumulate in fp32 and round once: a 4-deep chain of 512-term reductions (where the bf16
    reduction bound has none) with each contraction summed in another order stays within one rounding per op."""
    g = torch.Generator().manual_seed(1)
    ws = [(torch.randn(512, 512, generator=g) / 512**0.5).to(torch.bfloat16) for _ in range(4)]
    x = torch.randn(32, 512, generator=g).to(torch.bfloat16)
    perms = [torch.randperm(512, generator=g) for _ in ws]

    def chain(permuted: bool):
        h = x
        for w, p in zip(ws, perms, strict=True):
            h = torch.tanh(h[:, p] @ w[p] if permuted else h @ w)  # the same sum, its terms in another order
        return h

    direct, reordered = chain(False), chain(True)
    assert not torch.equal(direct, reordered)  # they do round apart: the bound is not vacuous here
    assert_close_up_to_rounding(reordered.float(), direct.float(), rounded_chain_rtol(torch.bfloat16, depth=4))
    assert rounded_chain_rtol(torch.bfloat16, 4) < 0.05  # still catches a 5% error of the outputs' scale
