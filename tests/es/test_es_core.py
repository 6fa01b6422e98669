"""ES core: estimator quality, optimisation, exact restore/replay, noise independence, bad input."""

import math
import warnings

import numpy as np
import pytest
import torch

from esopt.es import (
    ES,
    ESConfig,
    Ledger,
    NoiseSource,
    ParamScope,
    Schedule,
    ZeroVariancePopulation,
    centered_rank,
    identity,
    measure_restore_drift,
    read_history,
    replay,
    select_parameters,
    stream_seed,
    zscore,
)
from tests.tolerance import ulps


class Vec(torch.nn.Module):
    def __init__(self, x, dtype=torch.float32):
        super().__init__()
        self.x = torch.nn.Parameter(torch.as_tensor(x, dtype=dtype))


def small_net(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)).to(dtype)


def run_es(f, x0, generations, seed=0, **kw):
    model = Vec(x0)
    es = ES(model, ESConfig(total_generations=generations, seed=seed, **kw))
    for _ in range(generations):
        rewards = []
        for member in es.ask():
            with es.perturbed(member):
                rewards.append(-f(model.x.detach().double()))
        es.tell(rewards)
    return model.x.detach().double()


# --- estimator and optimisation -------------------------------------------------------------------

def test_gradient_estimate_cosine_on_quadratic():
    d, pairs = 200, 2000
    rng = np.random.default_rng(0)
    a = torch.tensor(rng.uniform(0.5, 2.0, d))
    x0 = torch.tensor(rng.normal(size=d))
    f = lambda x: float(0.5 * (a * x * x).sum())  # noqa: E731
    model = Vec(x0)
    es = ES(model, ESConfig(population_size=2 * pairs, antithetic=True, sigma=1e-2, alpha=1.0,
                            sigma_schedule="constant", chunk_numel=64))
    rewards = []
    for member in es.ask():
        with es.perturbed(member):
            rewards.append(-f(model.x.detach().double()))
    es.tell(rewards)
    step = model.x.detach().double() - x0
    true_ascent = -(a * x0)
    cos = float(step @ true_ascent / (step.norm() * true_ascent.norm()))
    theory = math.sqrt(pairs / (pairs + d))
    assert cos >= 0.9, (cos, theory)


@pytest.mark.parametrize("seed", [0, 1])
def test_es_closes_gap_on_quadratic(seed):
    rng = np.random.default_rng(seed)
    a = torch.tensor(rng.uniform(0.5, 2.0, 20))
    x0 = rng.normal(size=20)
    f = lambda x: float((a * x * x).sum())  # noqa: E731
    x = run_es(f, x0, 150, seed=seed, population_size=32, antithetic=True, sigma=0.1, sigma_min=0.01,
               alpha=0.1, alpha_min=0.005, alpha_schedule="cosine")
    f0 = f(torch.tensor(x0))
    assert f(x) <= 0.1 * f0


@pytest.mark.parametrize("seed", [0, 1])
def test_es_closes_gap_on_rosenbrock(seed):
    f = lambda x: float((1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2)  # noqa: E731
    x0 = [-0.5, 0.5]
    x = run_es(f, x0, 1000, seed=seed, population_size=8, antithetic=True, sigma=0.005, sigma_min=0.001,
               alpha=0.008, alpha_min=0.0004, alpha_schedule="cosine")
    assert f(x) <= 0.1 * f(torch.tensor(x0)), f(x)


# --- perturb / restore ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_restore_is_bit_exact(dtype):
    model = small_net(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    es = ES(model, ESConfig(population_size=4, sigma=1e-2, restore="exact"))
    for g in range(25):
        for member in es.ask(g):
            with es.perturbed(member):
                assert not torch.equal(model[0].weight, before["0.weight"])
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_subtract_drift_is_measured():
    net = small_net()
    # each cycle adds sigma*eps and takes it away: two roundings of half an ulp at |theta| + 8 sigma at most
    peak = max(float(p.abs().max()) for p in net.parameters()) + 8 * 1e-2
    fp32 = measure_restore_drift(net, ESConfig(restore="subtract", sigma=1e-2), cycles=20)
    bf16 = measure_restore_drift(small_net(torch.bfloat16), ESConfig(restore="subtract", sigma=1e-2), cycles=20)
    exact = measure_restore_drift(small_net(torch.bfloat16), ESConfig(restore="exact", sigma=1e-2), cycles=20)
    assert 0 < fp32["max_abs"] <= float(ulps(torch.tensor(peak), 20))
    assert bf16["max_abs"] > 10 * fp32["max_abs"] and bf16["frac_changed"] > 0.01
    assert exact == {"max_abs": 0.0, "mean_abs": 0.0, "frac_changed": 0.0}


@pytest.mark.parametrize("restore", ["exact", "subtract"])
def test_perturbed_restores_on_exception(restore):
    """An exception inside the block restores the weights: bit for bit with the exact restore (in fp32 and
    bf16), to rounding (one ulp of the perturbed value) when the noise is subtracted again."""
    for dtype in (torch.float32, torch.bfloat16):
        model = small_net(dtype)
        before = [p.detach().clone() for p in model.parameters()]
        es = ES(model, ESConfig(population_size=2, restore=restore, sigma=0.5))
        with pytest.raises(KeyError), es.perturbed(es.ask()[0]):
            assert not torch.equal(next(model.parameters()), before[0])  # the noise is in
            raise KeyError("rollout crashed")
        for p, b in zip(model.parameters(), before):
            if restore == "exact":
                assert torch.equal(p, b)
            elif dtype == torch.float32:  # |theta + 0.5 eps| < 4 here: one fp32 ulp is 2^-22 at most
                torch.testing.assert_close(p, b, rtol=0, atol=2**-21)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("restore", ["exact", "subtract"])
@pytest.mark.parametrize("fail_at", [5, 77])  # 512-element 0.weight in chunks of 7: mid 0.weight; mid 0.bias
def test_a_perturbation_interrupted_mid_tensor_is_undone(dtype, restore, fail_at, monkeypatch):
    """Ctrl-C while the noise is being written (here: at the fail_at-th chunk drawn) leaves no half-perturbed
    tensor behind: the finished chunks of the interrupted tensor and the finished tensors are undone."""
    model = small_net(dtype)
    before = [p.detach().clone() for p in model.parameters()]
    es = ES(model, ESConfig(population_size=2, restore=restore, sigma=0.5, chunk_numel=7))
    real, calls = type(es.perturbation).draw, []

    def flaky(self, *args, **kwargs):
        calls.append(args[:3])
        if len(calls) == fail_at:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(es.perturbation), "draw", flaky)
    with pytest.raises(KeyboardInterrupt), es.perturbed(es.ask()[0]):
        pass
    monkeypatch.undo()
    assert calls[fail_at - 1][1] == ("0.weight" if fail_at < 74 else "0.bias")
    for p, b in zip(model.parameters(), before):
        if restore == "exact":
            assert torch.equal(p, b)
        elif dtype == torch.float32:
            torch.testing.assert_close(p, b, rtol=0, atol=2**-21)
    with es.perturbed(es.ask()[0]):  # nothing is left "still applied"
        pass


def test_nested_perturbation_is_refused():
    es = ES(small_net(), ESConfig(population_size=2))
    a, b = es.ask()
    with es.perturbed(a), pytest.raises(RuntimeError, match="still applied"):
        with es.perturbed(b):
            pass


def test_perturbation_equals_sigma_times_full_noise_with_small_chunks():
    model = small_net()
    base = model[0].weight.detach().clone()
    es = ES(model, ESConfig(population_size=2, sigma=0.1, chunk_numel=100, sigma_schedule="constant"))
    member = es.ask()[0]
    with es.perturbed(member):
        eps = NoiseSource(100).full(member.seed, "0.weight", base.shape)
        torch.testing.assert_close(model[0].weight.detach(), base + 0.1 * eps)


def test_antithetic_members_share_seeds_with_opposite_signs():
    es = ES(small_net(), ESConfig(population_size=6, antithetic=True))
    m = es.ask()
    assert [x.sign for x in m] == [1, -1] * 3
    assert m[0].seed == m[1].seed and m[2].seed == m[3].seed and m[0].seed != m[2].seed
    assert [x.seed for x in es.ask(0)] == [x.seed for x in ES(small_net(), es.config).ask(0)]


# --- noise ----------------------------------------------------------------------------------------

def test_noise_streams_of_two_tensors_are_uncorrelated_and_deterministic():
    src = NoiseSource()
    n = 1_000_000
    a = src.full(1234, "layers.0.weight", (n,)).double()
    b = src.full(1234, "layers.1.weight", (n,)).double()
    c = src.full(1235, "layers.0.weight", (n,)).double()
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([a, c]))[0, 1])) < 0.01
    assert abs(float(a.mean())) < 0.01 and abs(float(a.std()) - 1) < 0.01
    assert torch.equal(a, NoiseSource().full(1234, "layers.0.weight", (n,)).double())
    assert stream_seed(1, "w", 0) != stream_seed(1, "w", 1) != stream_seed(2, "w", 1)


# --- update and ledger ----------------------------------------------------------------------------

def train_with_ledger(model, path, generations=3, **kw):
    es = ES(model, ESConfig(population_size=6, antithetic=True, sigma=1e-2, alpha=1e-2,
                            total_generations=generations, **kw), ledger=path)
    rng = np.random.default_rng(0)
    for _ in range(generations):
        es.ask()
        es.tell(rng.normal(size=6))
    return es


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_rebuilds_bit_exact_weights(tmp_path, dtype):
    trained = small_net(dtype)
    train_with_ledger(trained, tmp_path / "history.jsonl", generations=4, weight_decay=0.1)
    rebuilt = replay(small_net(dtype), tmp_path / "history.jsonl")
    for (n, p), q in zip(trained.named_parameters(), rebuilt.parameters()):
        assert torch.equal(p, q), n
    assert not torch.equal(trained[0].weight, small_net(dtype)[0].weight)
    partial = replay(small_net(dtype), tmp_path / "history.jsonl", upto=2)
    assert not torch.equal(partial[0].weight, trained[0].weight)


def test_ledger_lines_hold_the_generation(tmp_path):
    train_with_ledger(small_net(), tmp_path / "h.jsonl", generations=2)
    records = read_history(tmp_path / "h.jsonl")
    assert [r["generation"] for r in records] == [0, 1]
    r = records[0]
    assert len(r["seeds"]) == len(r["weights"]) == len(r["rewards"]) == 6
    assert r["noise"]["version"] == 1 and r["scope"] == {"kind": "full", "pattern": None}
    assert r["sigma"] == pytest.approx(1e-2) and r["alpha"] == pytest.approx(1e-2)


def test_torn_last_ledger_line_is_ignored(tmp_path):
    path = tmp_path / "h.jsonl"
    train_with_ledger(small_net(), path, generations=2)
    with open(path, "a") as f:
        f.write('{"generation": 2, "seeds": [1, 2')
    with pytest.warns(UserWarning, match="torn"):
        assert len(read_history(path)) == 2
    with pytest.warns(UserWarning, match="torn"):
        Ledger(path).truncate(2)
    assert len(read_history(path)) == 2


def test_a_damaged_ledger_is_refused_not_replayed(tmp_path):
    """Only a torn *last* line is an interrupted write; a corrupt line inside, generations out of order, or a
    noise spec that changes mid-run mean the ledger is not what the run did: reading or replaying it fails."""
    import json

    path = tmp_path / "h.jsonl"
    train_with_ledger(small_net(), path, generations=3)
    lines = path.read_text().splitlines()
    (tmp_path / "middle.jsonl").write_text("\n".join([lines[0], lines[1][:20], lines[2]]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_history(tmp_path / "middle.jsonl")
    (tmp_path / "order.jsonl").write_text("\n".join([lines[0], lines[2], lines[1]]) + "\n")
    with pytest.raises(ValueError, match="line 2 has generation 2, expected 1"):
        read_history(tmp_path / "order.jsonl")
    records = [json.loads(x) for x in lines]
    records[2]["noise"] = {**records[2]["noise"], "version": records[2]["noise"]["version"] + 1}
    with pytest.raises(ValueError, match="generation 2 changed the noise spec"):
        replay(small_net(), records)


def test_update_matches_formula():
    model = Vec(torch.zeros(50))
    es = ES(model, ESConfig(population_size=3, sigma=0.1, alpha=0.3, shaping="identity"))
    members = es.ask()
    es.tell([1.0, -2.0, 0.5])
    src = NoiseSource()
    expected = sum(w * src.full(m.seed, "x", (50,)) for w, m in zip([1.0, -2.0, 0.5], members)) * 0.3 / 3
    torch.testing.assert_close(model.x.detach(), expected)


def test_update_with_weight_decay_matches_formula():
    """theta <- theta * (1 - alpha * weight_decay) + alpha / N * sum_i w_i eps_i (decoupled, AdamW-style)."""
    model = Vec(torch.full((50,), 2.0))
    es = ES(model, ESConfig(population_size=3, sigma=0.1, alpha=0.3, shaping="identity", weight_decay=0.1))
    members = es.ask()
    es.tell([1.0, -2.0, 0.5])
    src = NoiseSource()
    step = sum(w * src.full(m.seed, "x", (50,)) for w, m in zip([1.0, -2.0, 0.5], members)) * 0.3 / 3
    torch.testing.assert_close(model.x.detach(), 2.0 * (1 - 0.3 * 0.1) + step)


def test_combine_is_the_update_direction():
    model = Vec(torch.zeros(50))
    es = ES(model, ESConfig(population_size=3, sigma=0.1, alpha=0.3, shaping="identity"))
    members = es.ask()
    coefs = {m.seed: w for m, w in zip(members, [1.0, -2.0, 0.5])}
    (combined,) = es.perturbation.combine(coefs)
    src = NoiseSource()
    torch.testing.assert_close(combined, sum(c * src.full(s, "x", (50,)) for s, c in coefs.items()))
    es.tell([1.0, -2.0, 0.5])
    torch.testing.assert_close(model.x.detach(), combined * 0.3 / 3)


def test_zero_variance_population_gives_zero_update_and_warns():
    model = small_net()
    before = [p.detach().clone() for p in model.parameters()]
    es = ES(model, ESConfig(population_size=4))
    es.ask()
    with pytest.warns(ZeroVariancePopulation):
        result = es.tell([0.0, 0.0, 0.0, 0.0])
    assert result.zero_variance and result.update_rms == 0.0
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b) and torch.isfinite(p).all()


# --- shaping, schedules, scope --------------------------------------------------------------------

def test_shaping_functions_on_hand_computed_arrays():
    np.testing.assert_allclose(zscore([1.0, 2.0, 3.0]), [-1.224744871, 0.0, 1.224744871], rtol=1e-7)
    np.testing.assert_allclose(centered_rank([10.0, -1.0, 3.0]), [0.5, -0.5, 0.0])
    np.testing.assert_allclose(centered_rank([1.0, 1.0, 5.0, 0.0]), [0.0, 0.0, 0.5, -0.5])
    np.testing.assert_array_equal(identity([3.0, -1.0]), [3.0, -1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZeroVariancePopulation)
        np.testing.assert_array_equal(centered_rank([2.0, 2.0]), [0.0, 0.0])
        np.testing.assert_array_equal(zscore([7.0]), [0.0])


def test_schedules():
    cos = Schedule("cosine", 1e-3, 2.5e-4, 100)
    assert cos(0) == pytest.approx(1e-3) and cos(99) == pytest.approx(2.5e-4) and cos(1000) == pytest.approx(2.5e-4)
    assert cos(49) > cos(50) > 2.5e-4
    assert Schedule("linear", 1.0, 0.0, 3)(1) == pytest.approx(0.5)
    assert Schedule("constant", 0.2, 0.0, 10)(7) == 0.2
    assert ESConfig().sigma_min > 0  # the paper's floor, not 0


def test_scope_selection_and_tied_weights():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied
    model = torch.nn.ModuleDict({"emb": emb, "norm": torch.nn.LayerNorm(4), "head": head, "mlp": torch.nn.Linear(4, 4)})
    full = [n for n, _ in select_parameters(model, ParamScope())]
    assert full.count("emb.weight") == 1 and "head.weight" not in full and len(full) == 5
    linear = [n for n, _ in select_parameters(model, ParamScope("linear"))]
    assert linear == ["emb.weight", "mlp.weight"]  # the tied head is counted once, under its first name
    assert [n for n, _ in select_parameters(model, ParamScope("regex", r"^norm\."))] == ["norm.weight", "norm.bias"]
    with pytest.raises(ValueError, match="selects no parameters"):
        select_parameters(model, ParamScope("regex", "nothing"))


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"population_size": 0}, "greater than or equal to 1"),
        ({"population_size": 3, "antithetic": True}, "even population_size"),
        ({"sigma": -1e-3}, "greater than 0"),
        ({"shaping": "softmax"}, "'zscore', 'centered_rank' or 'identity'"),
        ({"sigma_schedule": "exp"}, "'constant', 'cosine' or 'linear'"),
        ({"restore": "undo"}, "'exact' or 'subtract'"),
        ({"scope": "regex"}, "needs a pattern"),
    ],
)
def test_bad_config_raises_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ESConfig(**kwargs)


def test_bad_rewards_raise_clear_errors():
    es = ES(small_net(), ESConfig(population_size=3))
    with pytest.raises(RuntimeError, match="before ask"):
        es.tell([1.0, 2.0, 3.0])
    es.ask()
    with pytest.raises(ValueError, match="got 2 rewards for a population of 3"):
        es.tell([1.0, 2.0])
    with pytest.raises(ValueError, match="reward of member 1 is nan"):
        es.tell([1.0, float("nan"), 3.0])
    with pytest.raises(ValueError, match="empty"):
        zscore([])



def test_weights_changed_hook_fires_on_perturb_restore_and_update():
    model = small_net()
    calls = []
    es = ES(model, ESConfig(population_size=2, sigma=0.1, alpha=0.1), on_weights_changed=lambda: calls.append(1))
    members = es.ask()
    with es.perturbed(members[0]):
        assert len(calls) == 1  # perturbed
    assert len(calls) == 2  # restored
    es.tell([1.0, 0.0])
    assert len(calls) == 3  # updated
    assert es.last_record["generation"] == 0 and es.last_record["noise"]["dist"] == "normal"


def test_explicit_sigma_overrides_the_schedule():
    model = small_net()
    es = ES(model, ESConfig(population_size=2, sigma=0.1, sigma_schedule="constant"))
    name, p = es.perturbation.params[0]
    base = p.detach().clone()
    member = es.ask()[0]
    with es.perturbed(member, sigma=0.2):
        big = (p.detach() - base).clone()
    with es.perturbed(member):
        small = (p.detach() - base).clone()
    # each is base + sigma eps rounded (half a unit of it), minus base (exact): 1.5 units of |base| + |big| apart
    assert ((big - 2 * small).abs() <= ulps(base.abs() + big.abs(), 1.5)).all()


def test_ledger_records_where_noise_was_drawn_and_replay_refuses_to_mix(tmp_path):
    model = small_net()
    es = ES(model, ESConfig(population_size=2, sigma=0.1, alpha=0.1), ledger=tmp_path / "h.jsonl")
    es.ask()
    es.tell([1.0, 0.0])
    (record,) = read_history(tmp_path / "h.jsonl")
    assert record["noise"]["device"] == "cpu"
    gpu_record = {**record, "noise": {**record["noise"], "device": "cuda"}}
    with pytest.raises(ValueError, match="drawn on cuda but the weights are on cpu"):
        replay(small_net(), [gpu_record])
