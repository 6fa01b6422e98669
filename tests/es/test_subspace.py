"""The LoRA-shaped subspace kind: A0 is one fixed basis per matrix (the same for every member and generation),
only B comes from the member, so every update of a run stays in span(A0) and replays bit-exactly."""

import torch

from esopt.es import ES, ESConfig, replay
from esopt.es.noise import NoiseSource
from esopt.es.perturbation import SubspaceNoise
from tests.tolerance import assert_close_up_to_rounding, reduction_rtol


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3, bias=False))


def config(**kw) -> ESConfig:
    return ESConfig(population_size=4, sigma=0.1, sigma_schedule="constant", noise="subspace", noise_rank=2,
                    alpha=0.05, **kw)


def test_members_share_the_fixed_basis_and_differ_in_b():
    model = net()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    es = ES(model, config())
    src = NoiseSource()
    for member in es.ask(0)[:2]:
        with es.perturbed(member):
            got = {n: p.detach().clone() for n, p in model.named_parameters()}
        for name in ("0.weight", "2.weight"):
            out_dim, in_dim = base[name].shape
            a0 = src.full(SubspaceNoise.BASIS_SEED, name + "#A0", (out_dim, 2))
            b = src.full(member.seed, name + "#B", (in_dim, 2))
            torch.testing.assert_close(got[name], base[name] + 0.1 * member.sign * (a0 @ b.T) / 2 ** 0.5)
        assert torch.equal(got["1.weight"], base["1.weight"])  # vectors frozen by default
    assert es.perturbation.searched_dimension == 2 * 6 + 2 * 5  # r * in per matrix


def test_updates_stay_in_the_span_of_the_basis_and_replay_exactly():
    model = net()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    es = ES(model, config())
    for g in range(3):
        es.ask(g)
        es.tell([1.0, -2.0, 0.5, 3.0 + g])
    src = NoiseSource()
    for name in ("0.weight", "2.weight"):
        change = model.state_dict()[name] - base[name]
        assert change.abs().max() > 0
        a0 = src.full(SubspaceNoise.BASIS_SEED, name + "#A0", (change.shape[0], 2))
        inside = a0 @ torch.linalg.lstsq(a0, change).solution  # projection onto span(A0)
        # least squares of a 2-column basis, then its product: rounding over the rows' reductions
        assert_close_up_to_rounding(inside, change, reduction_rtol(torch.float32, change.shape[0], depth=3))
        assert torch.linalg.matrix_rank(change) <= 2


def test_replay_rebuilds_a_subspace_run_bit_for_bit(tmp_path):
    model = net()
    es = ES(model, config(), ledger=tmp_path / "history.jsonl")
    for g in range(3):
        es.ask(g)
        es.tell([0.3, -1.0, 2.0, 1.0 + g])
    again = replay(net(), tmp_path / "history.jsonl")
    for (n, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(p, q), n
