"""Low-rank (EGGROLL) noise: what a member's perturbation is, that training with it replays bit-exactly,
and that parameters outside its reach stay put."""

import pytest
import torch
from safetensors.torch import load_file

from esopt.es import ES, ESConfig, read_history, replay
from esopt.es.noise import NoiseSource
from esopt.es.perturbation import LowRankNoise
from esopt.train.config import load_config
from esopt.train.es import train
from esopt.train.models import load_model
from tests.tolerance import reduction_rtol, ulps


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3, bias=False))


def test_member_perturbation_is_sigma_a_b_transposed_over_root_r():
    model = net()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    es = ES(model, ESConfig(population_size=2, sigma=0.1, sigma_schedule="constant", noise="lowrank", noise_rank=2))
    member = es.ask()[0]
    names = [n for n, _ in es.perturbation.params]
    assert names == ["0.weight", "2.weight"]  # matrices only: biases and the norm are frozen
    with es.perturbed(member):
        got = {n: p.detach().clone() for n, p in model.named_parameters()}
    src = NoiseSource()
    for name in names:
        out_dim, in_dim = base[name].shape
        a = src.full(member.seed, name + "#A", (out_dim, 2))
        b = src.full(member.seed, name + "#B", (in_dim, 2))
        delta = 0.1 * member.sign * (a @ b.T) / 2**0.5
        expected = base[name] + delta
        # another order of the rank-2 product and the scaling: the product's bound, and w + delta's rounding
        bound = reduction_rtol(torch.float32, 2, depth=2) * delta.abs() + ulps(expected, 1)
        assert ((got[name] - expected).abs() <= bound).all()
    for name in ("0.bias", "1.weight", "1.bias"):
        assert torch.equal(got[name], base[name])
    es.tell([1.0, -1.0])
    after = dict(model.named_parameters())
    assert not torch.equal(after["0.weight"].detach(), base["0.weight"])
    assert torch.equal(after["1.weight"].detach(), base["1.weight"])
    # the update of two rank-2 members is rank <= 4, here rank 3 (5x3 matrix): more than one member's rank
    change = after["2.weight"].detach() - base["2.weight"]
    assert torch.linalg.matrix_rank(change) == 3


def test_others_full_perturbs_vectors_with_dense_noise():
    model = net()
    es = ES(model, ESConfig(population_size=2, sigma=0.1, noise="lowrank", noise_others="full"))
    assert "1.weight" in [n for n, _ in es.perturbation.params]


@pytest.mark.parametrize("restore", ["exact", "none"])
def test_row_blocks_accumulate_exactly_what_one_full_size_delta_does(restore):
    # chunk_numel 7 cuts the 5x6 matrix into one-row blocks (the 3x5 one into single rows too): perturbing and
    # updating block by block must give the full-size accumulation bit for bit, so older ledgers replay unchanged
    model = net()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    pert = LowRankNoise(list(model.named_parameters()), LowRankNoise.make_spec(chunk_numel=7, rank=2, others="full"),
                        restore=restore)
    coefs = {11: 0.5, 12: -1.25, 13: 2.0}
    want = {}
    for name, p in pert.params:
        acc = torch.zeros(p.shape)
        for seed, c in coefs.items():
            if p.dim() == 2:
                a, b = pert.factors(seed, name, p.shape, p.device)
                for k in range(2):
                    acc.addr_(a[:, k], b[:, k], alpha=c * 2 ** -0.5)
            else:
                acc.add_(NoiseSource(7).full(seed, name, p.shape), alpha=c)
        want[name] = acc
        assert torch.equal(pert.delta(coefs, name, p), acc), name
    for _ in pert.perturb(11, 0.5):
        pass
    for name, p in pert.params:
        a, b = pert.factors(11, name, p.shape, p.device) if p.dim() == 2 else (None, None)
        if a is not None:
            one = torch.zeros(p.shape).addr_(a[:, 0], b[:, 0], alpha=0.5 * 2 ** -0.5).addr_(a[:, 1], b[:, 1],
                                                                                               alpha=0.5 * 2 ** -0.5)
            assert torch.equal(p.detach(), base[name] + one), name
    if restore == "exact":
        pert.restore(11, 0.5)
    else:  # batched populations never perturb in place; put the base back by hand
        for name, p in pert.params:
            p.data.copy_(base[name])
    assert all(torch.equal(p.detach(), base[n]) for n, p in pert.params)
    pert.update(coefs, step=1.0)
    for name, p in pert.params:
        assert torch.equal(p.detach(), base[name] + want[name]), name


def test_lowrank_training_replays_bit_exactly(tmp_path):
    out = tmp_path / "run"
    train(load_config("smoke", ["steps=2", "eval.tasks=2", "eval.every=0", "es.noise=lowrank", "es.noise_rank=2",
                                "es.sigma=5e-2", "es.sigma_min=2e-2", "measure_inference_peak=false"]),
          out, progress=False)
    records = read_history(out / "history.jsonl")
    assert all(r["noise"]["dist"] == "lowrank" and r["noise"]["rank"] == 2 for r in records)
    assert any(any(r["weights"]) for r in records)  # at least one real update to replay
    config = load_config(out / "config.yaml")
    policy = load_model(config.model, config.env.kwargs)
    replay(policy.model, records)
    trained = load_file(str(out / "final" / "model.safetensors"))
    for name, p in policy.model.named_parameters():
        assert torch.equal(p.detach(), trained[name]), name


def test_rows_in_blocks_are_recognised_only_when_exact():
    from esopt.es.batched import _blocks

    assert _blocks([]) is None
    members, k = _blocks([2, 2, 0, 0, 5, 5])
    assert members.tolist() == [2, 0, 5] and k == 2
    assert _blocks([0, 1, 2])[1] == 1
    assert _blocks([0, 0, 1]) is None  # unequal blocks
    assert _blocks([0, 0, 1, 1, 0, 0]) is None  # a member in two blocks
    assert _blocks([0, 1, 0, 1]) is None


@pytest.mark.parametrize("chunk_tokens, members_per_rollout", [(1024, None), (1, None), (1024, 3)])
def test_batched_evaluator_writes_what_the_sequential_one_writes(tmp_path, monkeypatch, chunk_tokens,
                                                                 members_per_rollout):
    """Greedy: every member's batched episodes are token for token the in-place members' episodes, also when
    the members' prefix passes run one member at a time (and the next turns reuse them from the store), and
    when the members run in blocks of 3 (each block's rollout decodes only its own rows)."""
    monkeypatch.setattr("esopt.engines.prefix.PREFIX_CHUNK_TOKENS", chunk_tokens)
    from esopt.population import PopulationContext
    from esopt.population.batched import BatchedEvaluator
    from esopt.population.local import LocalEvaluator
    from esopt.train.evaluate import rollout_spec
    from esopt.train.tasks import env_factory

    config = load_config("smoke", ["es.noise=lowrank", "es.sigma=0.2", "es.sigma_schedule=constant",
                                   "sampling.temperature=0", "es.batched=true"])
    policy = load_model(config.model, config.env.kwargs)
    make = env_factory(config)
    es = ES(policy.model, config.es_config)
    members, tasks = es.ask(0), [101, 102, 103]
    spec = rollout_spec(config, make)
    context = PopulationContext(es, policy, make, config.es.reward, members_per_rollout=members_per_rollout)
    seq = LocalEvaluator(context).evaluate(members, 0.2, tasks, 5, spec)
    rows, generate = [], policy.generate

    def counted(prompts, *args, **kwargs):
        rows.append(len(prompts))
        return generate(prompts, *args, **kwargs)

    monkeypatch.setattr(policy, "generate", counted)
    bat = BatchedEvaluator(context).evaluate(members, 0.2, tasks, 5, spec)
    assert max(rows) == len(tasks) * min(members_per_rollout or len(members), len(members))
    texts = [[[t.token_ids for t in traj.turns] for traj in r.trajectories] for r in seq]
    assert texts == [[[t.token_ids for t in traj.turns] for traj in r.trajectories] for r in bat]
    assert len({str(t) for t in texts}) > 1  # the members really behave differently
    assert [r.reward for r in seq] == [r.reward for r in bat]


@pytest.mark.parametrize("chunk_tokens", [1024, 1])
def test_grouped_shared_prefix_decoding_matches_each_member_alone(monkeypatch, chunk_tokens):
    """Batched members with a shared prompt prefix: the prefix is encoded once per member (not once for all;
    in one pass, or in chunks of members), and every row decodes what its member decodes alone with its
    weights written in."""
    monkeypatch.setattr("esopt.engines.prefix.PREFIX_CHUNK_TOKENS", chunk_tokens)
    from esopt.engines.base import SamplingParams
    from esopt.engines.hf import HFEngine
    from esopt.es.batched import BatchedLowRank
    from esopt.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=4)
    policy = HFEngine(model, tok, min_prefix_tokens=8)
    es = ES(model, ESConfig(population_size=2, antithetic=True, sigma=0.3, sigma_schedule="constant",
                            noise="lowrank"))
    members = es.ask()
    prompts = ["Sudoku board follows here 1 2 3 4\n>", "Sudoku board follows here 4 3 2 1\n>"]
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    rows = [0, 0, 1, 1]
    host = BatchedLowRank(model, es.perturbation)
    with host.members(members, 0.3), policy.route_members(host):
        batched = policy.generate(prompts * 2, greedy, members=rows)
    assert policy.router is None  # routing ends with the block
    alone = []
    for m in members:
        with es.perturbed(m):
            alone += policy.generate(prompts, greedy)
    assert [c.token_ids for c in batched] == [c.token_ids for c in alone]
    assert batched[0].token_ids != batched[2].token_ids or batched[1].token_ids != batched[3].token_ids
