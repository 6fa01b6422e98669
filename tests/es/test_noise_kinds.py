"""A second noise kind plugs into the weight-host seam (`esopt.es.perturbation`): registered once, it
trains through the normal trainer, is recorded in the ledger, and replays bit-exactly."""

import torch
from safetensors.torch import load_file

from esopt.es import ES, ESConfig, GaussianNoise, read_history, register_perturbation, replay
from esopt.es.perturbation import PERTURBATIONS
from esopt.train.config import build_config, load_config
from esopt.train.es import train
from esopt.train.models import load_model


class RademacherNoise(GaussianNoise):
    """+-1 noise with the Gaussian kind's seeding and chunking: only the numbers differ."""

    dist = "rademacher"

    def draw(self, seed, name, k, length, device):
        eps = super().draw(seed, name, k, length, device)
        return eps.sign_().add_((eps == 0).float())  # exact zeros (measure 0) become +1


def test_a_registered_noise_kind_trains_and_replays_bit_exactly(tmp_path):
    register_perturbation(RademacherNoise)
    try:
        overrides = ["steps=2", "eval.tasks=2", "eval.every=0", "es.noise=rademacher", "measure_inference_peak=false"]
        out = tmp_path / "run"
        train(load_config("smoke", overrides), out, progress=False)
        records = read_history(out / "history.jsonl")
        assert all(r["noise"]["dist"] == "rademacher" and any(r["weights"]) for r in records)
        config = load_config(out / "config.yaml")
        policy = load_model(config.model, config.env.kwargs)
        base = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        replay(policy.model, records)
        trained = load_file(str(out / "final" / "model.safetensors"))
        for name, p in policy.model.named_parameters():
            assert torch.equal(p.detach(), trained[name]), name

        # the perturbation really is +-sigma per element around the base
        es = ES(policy.model, ESConfig(population_size=2, sigma=0.5, sigma_schedule="constant", noise="rademacher"))
        member = es.ask(0)[0]
        name, param = es.perturbation.params[0]
        before = param.detach().clone()
        with es.perturbed(member):
            delta = (param.detach() - before).abs()
        torch.testing.assert_close(delta, torch.full_like(delta, 0.5))
        assert torch.equal(param.detach(), before)
        assert any(not torch.equal(base[n], p.detach()) for n, p in policy.model.named_parameters())
    finally:
        PERTURBATIONS.pop("rademacher", None)


def test_an_unknown_noise_kind_is_a_config_error():
    import pytest

    from esopt.train.config import ConfigError

    with pytest.raises(ConfigError, match="unknown noise kind 'sparse'"):
        build_config({}, ["es.noise=sparse"])
