"""Adam on the ES gradient: each generation's update is Adam's step on g = 1/G sum_i w_i eps_i, computed here by
hand from the dense noise; the moments live in the perturbation, and replay rebuilds them from generation 0."""

import pytest
import torch

from esopt.es import ES, ESConfig, read_history, replay
from esopt.es.perturbation import update_coefficients
from tests.tolerance import ulps, unit_roundoff


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def config(**kw) -> ESConfig:
    return ESConfig(population_size=4, antithetic=True, sigma=0.1, sigma_schedule="constant", alpha=0.01,
                    optimizer="adam", adam_beta1=0.8, adam_beta2=0.9, **kw)


@pytest.mark.parametrize("noise", ["normal", "lowrank"])
def test_each_update_is_adams_step_on_the_es_gradient(noise, tmp_path):
    model = net()
    es = ES(model, config(noise=noise), ledger=tmp_path / "h.jsonl")
    theta = [p.detach().clone() for _, p in es.perturbation.params]
    m = [torch.zeros_like(t) for t in theta]
    v = [torch.zeros_like(t) for t in theta]
    # The gradient is formed the same way here and in ES; what differs is the order of Adam's elementwise operations.
    # Each step's |m_hat| / denom is at most ~1/sqrt(1 - beta2) and rounds within a few units of that, so the step
    # is off by at most lr * 32 u; adding it to theta rounds once more (an ulp of theta).
    tol = [torch.zeros_like(t) for t in theta]
    for t in range(1, 4):
        es.ask(t - 1)
        es.tell([1.0, -0.5, 0.25 * t, 2.0])
        record = read_history(tmp_path / "h.jsonl")[-1]
        assert record["optimizer"] == {"kind": "adam", "beta1": 0.8, "beta2": 0.9, "eps": 1e-8}
        coefs = {s: c / record["population_size"] for s, c in update_coefficients(record).items()}
        grads = es.perturbation.combine(coefs)
        for k, (_, p) in enumerate(es.perturbation.params):
            g = grads[k].reshape(theta[k].shape)
            m[k] = 0.8 * m[k] + 0.2 * g
            v[k] = 0.9 * v[k] + 0.1 * g * g
            theta[k] = theta[k] + 0.01 * (m[k] / (1 - 0.8 ** t)) / ((v[k] / (1 - 0.9 ** t)).sqrt() + 1e-8)
            tol[k] += 0.01 * 32 * unit_roundoff(torch.float32) + ulps(theta[k], 2)
            assert ((p.detach() - theta[k]).abs() <= tol[k]).all(), float((p.detach() - theta[k]).abs().max())


def test_replay_rebuilds_the_moments_and_the_weights_bit_for_bit(tmp_path):
    model = net()
    es = ES(model, config(), ledger=tmp_path / "h.jsonl")
    for g in range(4):
        es.ask(g)
        es.tell([0.1 * g, 1.0, -1.0, 0.5])
    again = replay(net(), tmp_path / "h.jsonl")
    for (n, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(p, q), n
    ahead = ES(net(), config())
    ahead.fast_forward(read_history(tmp_path / "h.jsonl"))  # the trainer's resume path: the same numbers
    for (n, p), (_, q) in zip(model.named_parameters(), ahead.model.named_parameters()):
        assert torch.equal(p, q), n
    sgd = replay(net(), [{k: v for k, v in r.items() if k != "optimizer"} for r in read_history(tmp_path / "h.jsonl")])
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), sgd.parameters()))


def test_an_adam_ledger_cannot_be_applied_from_the_middle(tmp_path):
    es = ES(net(), config(), ledger=tmp_path / "h.jsonl")
    for g in range(2):
        es.ask(g)
        es.tell([0.0, 1.0, 2.0, 3.0])
    tail = read_history(tmp_path / "h.jsonl")[1:]
    with pytest.raises(ValueError, match="from generation 0"):
        replay(net(), tail)


def test_adam_settings_are_validated():
    with pytest.raises(ValueError, match="adam_beta1"):
        ESConfig(optimizer="adam", adam_beta1=1.0)
    with pytest.raises(ValueError, match="optimizer"):
        ESConfig(optimizer="lion")
