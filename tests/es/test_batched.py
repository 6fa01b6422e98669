"""Batched members: every batch row runs with its own member's weights, low-rank terms added per row or the
member's dense perturbed copy (full-rank)."""

import pytest
import torch

from esopt.es import ES, ESConfig
from esopt.es.batched import BatchedFullRank, BatchedLowRank, member_router
from esopt.models.tiny import build_tiny_model
from esopt.train.config import ConfigError, build_config, load_config
from esopt.train.models import load_model
from tests.tolerance import assert_close_up_to_rounding, network_rtol


def _es(model, **kw) -> ES:
    return ES(model, ESConfig(population_size=4, antithetic=True, sigma=0.05, sigma_schedule="constant", **kw))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_member_weights_are_what_the_in_place_member_writes(dtype):
    model, _ = build_tiny_model(seed=2)
    model.to(dtype)
    es = _es(model)  # restore "exact": perturbed weights are written from the fp32 master
    members = es.ask()
    pert = es.perturbation
    built = [pert.member_weights(k, [(m.seed, 0.05 * m.sign) for m in members]) for k in range(len(pert.params))]
    before = [p.detach().clone() for _, p in pert.params]
    for i, member in enumerate(members):
        with es.perturbed(member):
            for (name, p), w in zip(pert.params, built):
                assert w.dtype == dtype and torch.equal(w[i], p.detach()), name
    assert all(torch.equal(b, p.detach()) for b, (_, p) in zip(before, pert.params))


def test_member_weights_without_a_master_match_a_master_run_after_updates():
    """restore "none" (what batched runs use) keeps bf16 weights and their low bits: after the same updates its
    members' copies are those an fp32-master run writes in place, bit for bit."""
    exact_model, _ = build_tiny_model(seed=2)
    lean_model, _ = build_tiny_model(seed=2)
    exact_model.to(torch.bfloat16), lean_model.to(torch.bfloat16)
    exact, lean = _es(exact_model, alpha=0.05), _es(lean_model, alpha=0.05, restore="none")
    for g in range(2):
        for es in (exact, lean):
            es.ask(g)
            es.tell([0.1, 0.7, 0.3, 0.9])
    members = exact.ask(2)
    assert [(m.seed, m.sign) for m in members] == [(m.seed, m.sign) for m in lean.ask(2)]
    pert = lean.perturbation
    for k, (name, _) in enumerate(pert.params):
        built = pert.member_weights(k, [(m.seed, 0.05 * m.sign) for m in members])
        for i, member in enumerate(members):
            with exact.perturbed(member):
                assert torch.equal(built[i], exact.perturbation.params[k][1].detach()), (name, i)


def test_stacked_weights_serve_every_member_block_in_one_op():
    """Linear (with a frozen bias), Embedding and RMSNorm on rows in member blocks, with a member axis on the
    weight: each block as if its member's weight were the module's own."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from esopt.es.batched import _with_weight

    gen = torch.Generator().manual_seed(0)
    linear, embedding, norm = torch.nn.Linear(5, 3), torch.nn.Embedding(11, 5), LlamaRMSNorm(5)
    for module, x in ((linear, torch.randn(4, 2, 5, generator=gen)), (embedding, torch.randint(0, 11, (4, 2))),
                      (norm, torch.randn(4, 2, 5, generator=gen))):
        w = module.weight.detach() + torch.randn(2, *module.weight.shape, generator=gen)  # 2 members, 2 rows each
        both = _with_weight(module, x, w)
        for m in range(2):
            torch.testing.assert_close(both[2 * m:2 * m + 2], _with_weight(module, x[2 * m:2 * m + 2], w[m]))
        with torch.no_grad():
            torch.testing.assert_close(_with_weight(module, x, module.weight), module(x))


@pytest.mark.parametrize("noise, kind", [("normal", BatchedFullRank), ("lowrank", BatchedLowRank)])
@pytest.mark.parametrize("rows", [[0, 0, 1, 1, 2, 2, 3, 3],  # every member's rows in turn: one op per layer
                                  [0, 1, 2, 3, 1, 2],  # any rows: member by member (low-rank: per row)
                                  [3, 3, 1, 1]])  # blocks of some members
def test_batched_forward_equals_each_member_written_in(rows, noise, kind):
    model, _ = build_tiny_model(seed=3)  # tied embedding / LM head, RMSNorm weights: every kind of layer
    es = _es(model, noise=noise, noise_rank=2)
    members = es.ask()
    ids = torch.randint(4, 90, (len(rows), 7), generator=torch.Generator().manual_seed(0))
    host = member_router(model, es.perturbation)
    assert isinstance(host, kind)
    own = model.lm_head.forward = torch.nn.Linear.forward.__get__(model.lm_head)  # one set before (accelerate)
    with torch.no_grad():
        plain = model(ids).logits
        with host.members(members, 0.05):
            host.set_rows(rows)
            batched = model(ids).logits
    for r, m in enumerate(rows):
        with torch.no_grad(), es.perturbed(members[m]):
            expected = model(ids[r:r + 1]).logits[0]
        atol = assert_close_up_to_rounding(batched[r], expected, network_rtol(model))
        assert (batched[r] - plain[r]).abs().max() > 10 * atol  # the member's noise is really there
    torch.testing.assert_close(model(ids).logits, plain)  # hooks gone: the base model again
    with host.members(members, 0.05), pytest.raises(RuntimeError, match="set_rows"):
        model(ids)
    assert model.lm_head.__dict__.pop("forward") is own  # the block put back what it found
    assert all("forward" not in m.__dict__ for m in model.modules())  # none left replaced, also after an error


class ScaledEmbedding(torch.nn.Embedding):
    def forward(self, ids):
        return super().forward(ids) * 2.0


def test_batched_full_rank_serves_only_layers_it_knows():
    model, _ = build_tiny_model(seed=3)
    model.extra = torch.nn.Conv1d(2, 2, 1)  # a parameter of a layer kind the router cannot split by rows
    with pytest.raises(ValueError, match="extra.weight is none of those"):
        BatchedFullRank(model, _es(model).perturbation)
    model, _ = build_tiny_model(seed=3)
    model.extra = ScaledEmbedding(4, 2)  # an Embedding by type, but not by what it computes
    with pytest.raises(ValueError, match="extra .ScaledEmbedding. does not compute"):
        BatchedFullRank(model, _es(model).perturbation)
    assert isinstance(member_router(model, _es(model, noise="lowrank").perturbation), BatchedLowRank)


def test_batched_full_rank_evaluator_writes_what_the_sequential_one_writes():
    """Greedy: each member's batched episodes are token for token its in-place episodes."""
    from esopt.population import PopulationContext
    from esopt.population.batched import BatchedEvaluator
    from esopt.population.local import LocalEvaluator
    from esopt.train.evaluate import rollout_spec
    from esopt.train.tasks import env_factory

    config = load_config("smoke", ["es.sigma=0.2", "es.sigma_schedule=constant", "sampling.temperature=0",
                                   "es.batched=true"])
    assert config.es.noise == "normal" and config.population_evaluator == "batched"
    policy = load_model(config.model, config.env.kwargs)
    make = env_factory(config)
    es = ES(policy.model, config.es_config)
    members, tasks = es.ask(0), [101, 102, 103]
    spec = rollout_spec(config, make)
    context = PopulationContext(es, policy, make, config.es.reward)
    seq = LocalEvaluator(context).evaluate(members, 0.2, tasks, 5, spec)
    bat = BatchedEvaluator(context).evaluate(members, 0.2, tasks, 5, spec)
    texts = [[[t.token_ids for t in traj.turns] for traj in r.trajectories] for r in seq]
    assert texts == [[[t.token_ids for t in traj.turns] for traj in r.trajectories] for r in bat]
    assert len({str(t) for t in texts}) > 1  # the members really behave differently
    assert [r.reward for r in seq] == [r.reward for r in bat]


def test_batched_config_takes_dense_noise_and_keeps_the_lowrank_rule():
    build_config({}, ["es.batched=true"])  # dense noise, every parameter: the full-rank router
    with pytest.raises(ConfigError, match="noise_others: frozen"):
        build_config({}, ["es.batched=true", "es.noise=lowrank", "es.noise_others=full"])
