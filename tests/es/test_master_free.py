"""Restore "none" (batched populations): no fp32 master copy, and updates exactly as an fp32 master accumulates
them: fp32 weights in place, bf16 weights with their fp32 value's low 16 bits beside them (int16)."""

import gc

import pytest
import torch
from safetensors.torch import load_file

from esopt.es import ES, ESConfig, read_history, replay
from esopt.es.perturbation import join_bf16, split_fp32
from esopt.models.tiny import build_tiny_model
from esopt.train.config import load_config
from esopt.train.es import train
from esopt.train.models import load_model

REWARDS = [[0.0, 1.0, 3.0, 2.0], [1.0, 0.0, 0.5, 2.5], [2.0, 2.0, 0.0, 1.0], [0.3, 0.9, 0.1, 0.2],
           [1.0, 3.0, 2.0, 0.0]]


def tiny(dtype: torch.dtype) -> torch.nn.Module:
    model, _ = build_tiny_model(seed=0)
    return model.to(dtype)


def es_config(restore: str, noise: str) -> ESConfig:
    # alpha small enough that a bf16 weight alone would drop most steps (its ulp near 0.02 is ~1e-4)
    return ESConfig(population_size=4, antithetic=True, sigma=1e-2, sigma_schedule="constant", alpha=2e-3,
                    weight_decay=0.05, noise=noise, restore=restore, total_generations=len(REWARDS))


def run(model: torch.nn.Module, restore: str, noise: str, ledger=None) -> ES:
    es = ES(model, es_config(restore, noise), ledger=ledger)
    for g, rewards in enumerate(REWARDS):
        es.ask(g)
        es.tell(rewards)
    return es


def fp32_values(es: ES) -> list[torch.Tensor]:
    """Every perturbed parameter's exact fp32 value (master, weights, or bf16 joined with its low bits)."""
    return [es.perturbation.exact_value(k).clone() for k in range(len(es.perturbation.params))]


def test_split_holds_any_fp32_exactly_and_rounds_to_nearest():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50_000, generator=gen) * torch.logspace(-30, 30, 50_000)
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e-45, -1e-45, 3.3e38, -3.3e38, 1.0, -1.0, 1.0 + 2**-8])])
    weights, low = split_fp32(x)
    assert weights.dtype == torch.bfloat16 and low.dtype == torch.int16
    assert torch.equal(join_bf16(weights, low).view(torch.int32), x.view(torch.int32))
    nearest = x.to(torch.bfloat16)  # round to nearest, ties to even; split_fp32 rounds ties away from zero
    differ = weights.view(torch.int16) != nearest.view(torch.int16)
    ties = (x.view(torch.int32) & 0xFFFF) == 0x8000
    assert bool((differ <= ties).all()) and bool(differ[-1])  # 1 + 2^-8 is a tie: rounded up, not to even


@pytest.mark.parametrize("noise", ["lowrank", "normal"])
def test_fp32_updates_in_place_equal_the_master_s_bit_for_bit(noise):
    exact, free = run(tiny(torch.float32), "exact", noise), run(tiny(torch.float32), "none", noise)
    assert free.perturbation.masters is None and all(x is None for x in free.perturbation.low_bits)
    base, moved = tiny(torch.float32), 0
    for (name, p), (_, q), master in zip(exact.perturbation.params, free.perturbation.params,
                                         exact.perturbation.masters):
        assert torch.equal(p, q) and torch.equal(q.detach().view(-1), master), name
        moved += int((q != base.get_parameter(name)).sum())
    assert moved > 0


@pytest.mark.parametrize("noise", ["lowrank", "normal"])
def test_bf16_weights_with_low_bits_hold_the_master_s_fp32_value(noise):
    exact, free = run(tiny(torch.bfloat16), "exact", noise), run(tiny(torch.bfloat16), "none", noise)
    lost = run(tiny(torch.bfloat16), "subtract", noise)  # bf16 alone: steps below an ulp vanish
    assert all(x.dtype == torch.int16 for x in free.perturbation.low_bits)
    want, got = fp32_values(exact), fp32_values(free)
    for (name, p), w, g in zip(free.perturbation.params, want, got):
        assert torch.equal(g.view(torch.int32), w.view(torch.int32)), name
        ties = (w.view(torch.int32) & 0xFFFF) == 0x8000
        assert bool(((p.detach().view(-1) != w.to(torch.bfloat16)) <= ties).all()), name  # compute weights: rounded
    assert any(bool((x != 0).any()) for x in free.perturbation.low_bits)  # the low bits carry real information
    assert not all(torch.equal(p, q) for (_, p), (_, q) in zip(exact.perturbation.params, lost.perturbation.params))


def test_batched_mode_keeps_no_fp32_master(tmp_path):
    base = ["es.noise=lowrank", "es.population_size=4", "es.tasks_per_member=2", "model.name=tiny"]
    batched = load_config("smoke", [*base, "es.batched=true"])
    assert batched.es_config.restore == "none" and load_config("smoke", base).es_config.restore == "exact"
    assert load_config("smoke", [*base, "es.batched=true", "es.restore=exact"]).es_config.restore == "exact"

    def fp32_state(model: torch.nn.Module) -> int:
        """Elements of fp32 tensors alive besides the model's own parameters and buffers (masters)."""
        own = {id(t) for t in (*model.parameters(), *model.buffers())}
        gc.collect()
        return sum(t.numel() for t in gc.get_objects()
                   if issubclass(type(t), torch.Tensor) and t.dtype == torch.float32 and id(t) not in own)

    for dtype, per_weight in ((torch.float32, 0), (torch.bfloat16, 2)):
        model = tiny(dtype)
        before = fp32_state(model)
        es = ES(model, batched.es_config)
        numel = es.perturbation.numel
        assert es.perturbation.masters is None and fp32_state(model) - before < numel // 100, dtype
        extra = sum(x.numel() * x.element_size() for x in es.perturbation.low_bits if x is not None)
        assert extra == per_weight * numel  # bf16: 2 bytes per weight instead of the master's 4
        weights = [p.detach().clone() for _, p in es.perturbation.params]
        with pytest.raises(KeyError), es.perturbed(es.ask(0)[0]):  # in place anyway: held, then restored exactly
            assert es.perturbation.held is not None and not torch.equal(es.perturbation.params[0][1], weights[0])
            raise KeyError("rollout crashed")
        assert es.perturbation.held is None and all(torch.equal(p, w) for (_, p), w in
                                                    zip(es.perturbation.params, weights))
        del es
        es = ES(model, ESConfig(noise="lowrank", restore="exact"))  # the check sees a master when there is one
        assert fp32_state(model) - before >= numel
        del es
    with pytest.raises(ValueError, match="fp32 and bf16 weights only"):
        ES(tiny(torch.float16), batched.es_config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_of_a_master_free_ledger_reproduces_the_weights(tmp_path, dtype):
    es = run(tiny(dtype), "none", "lowrank", ledger=tmp_path / "history.jsonl")
    records = read_history(tmp_path / "history.jsonl")
    assert [r["restore"] for r in records] == ["none"] * len(REWARDS)
    model = replay(tiny(dtype), records)
    for (name, p), q in zip(es.perturbation.params, (model.get_parameter(n) for n, _ in es.perturbation.params)):
        assert torch.equal(p, q), name


def test_batched_training_replays_bit_exactly(tmp_path):
    out = tmp_path / "run"
    train(load_config("smoke", ["steps=2", "eval.tasks=2", "eval.every=0", "es.noise=lowrank", "es.batched=true",
                                "es.sigma=5e-2", "es.sigma_min=2e-2", "measure_inference_peak=false"]),
          out, progress=False)
    records = read_history(out / "history.jsonl")
    assert all(r["restore"] == "none" for r in records) and any(any(r["weights"]) for r in records)
    config = load_config(out / "config.yaml")
    policy = load_model(config.model, config.env.kwargs)
    replay(policy.model, records)
    trained = load_file(str(out / "final" / "model.safetensors"))
    for name, p in policy.model.named_parameters():
        assert torch.equal(p.detach(), trained[name]), name


def test_a_resumed_run_keeps_the_restore_mode_of_its_ledger(tmp_path):
    """Replay reads the first ledger line's mode: a batched run begun with a master (an older esopt) goes on
    with one instead of switching to restore "none" mid-ledger."""
    from esopt.train.es import ESAlgorithm
    from esopt.train.rundir import RunDir
    from esopt.train.tasks import env_factory
    from esopt.utils.timers import Timers

    config = load_config("smoke", ["model.name=tiny", "es.noise=lowrank", "es.batched=true", "es.population_size=4"])
    policy = load_model(config.model, config.env.kwargs)
    rd = RunDir(tmp_path)
    old = ES(policy.model, config.es_config.model_copy(update={"restore": "exact"}), ledger=rd.history_path)
    old.ask(0)
    old.tell([0.0, 1.0, 2.0, 3.0])
    for start, mode in ((1, "exact"), (0, "none")):
        alg = ESAlgorithm(policy, config, rd, env_factory(config), Timers(), start, False)
        assert alg.es.perturbation.restore_mode == mode
        alg.close()
