"""`esopt analyze es-signal` measures what theory gives for a reward linear in the searched weights: with
antithetic pairs and identity shaping, u = 1/G sum_i f_i eps_i has E u = sigma a and
trace Cov(u) = sigma^2 (D + 1) |a|^2 / (G/2), so nsr = 2 (D + 1) / G."""

import math

import pytest
import torch

from esopt.experiments.es_signal import main, measure_variant
from esopt.train.config import build_config
from esopt.train.models import load_model
from tests.train.test_train_es import TINY

NORM = "model.layers.0.input_layernorm.weight"


def test_nsr_of_a_linear_reward_matches_theory(monkeypatch):
    from esopt.rollout import RolloutSpec, RolloutStats, Trajectory

    def linear_reward(self, policy, make, task_seeds, seed, **kwargs):
        param = dict(policy.model.named_parameters())[NORM]
        a = torch.linspace(-1.0, 1.0, param.numel())
        value = float((param.detach().reshape(-1) * a).sum())
        return [Trajectory(task_seed=s, reward=value) for s in task_seeds], RolloutStats(episodes=len(task_seeds))

    monkeypatch.setattr(RolloutSpec, "run", linear_reward)
    config = build_config({}, [*TINY, "es.reward=env", "es.population_size=8", "es.shaping=identity",
                               "es.scope=regex", f"es.scope_pattern={NORM.replace('.', '[.]')}"])
    policy = load_model(config.model, config.env.kwargs)
    row = measure_variant(config, policy, repeats=400, directions=4)
    d = row["dimension"]
    assert d == 128 and row["pair_disagreement"] == 1.0
    expected = 2 * (d + 1) / 8
    assert 0.7 * expected < row["nsr"] < 1.4 * expected, (row["nsr"], expected)
    assert row["episodes_for_signal"] == pytest.approx(row["nsr"] * 8 * 6)


@pytest.mark.slow
def test_smoke_run_writes_its_table_and_reuses_finished_variants(tmp_path, capsys):
    args = ["--smoke", "--variants", "baseline", "norms", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "norms: 3 generations" in capsys.readouterr().out
    assert (tmp_path / "es_signal" / "norms_h1.json").exists()
    text = (tmp_path / "es_signal.md").read_text()
    assert "| baseline |" in text and "| norms |" in text
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "baseline: 3 generations" not in out and "norms: 3 generations" not in out  # read back, not measured
    # measuring one more variant keeps the rows of those saved before, and measures only it
    assert main(["--smoke", "--variants", "greedy", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "greedy: 3 generations" in out and "baseline: 3 generations" not in out
    text = (tmp_path / "es_signal.md").read_text()
    assert all(f"| {v} |" in text for v in ("baseline", "norms", "greedy"))
    # a row saved before a config field existed (here: es.temperature) is still reused; one saved with
    # another config value is measured again
    import json

    path = tmp_path / "es_signal" / "norms_h1.json"
    saved = json.loads(path.read_text())
    del saved["key"]["config"]["es"]["temperature"]
    path.write_text(json.dumps(saved))
    assert main(["--smoke", "--variants", "norms", "--out", str(tmp_path)]) == 0
    assert "norms: 3 generations" not in capsys.readouterr().out
    saved["key"]["config"]["es"]["alpha"] *= 2
    path.write_text(json.dumps(saved))
    assert main(["--smoke", "--variants", "norms", "--out", str(tmp_path)]) == 0
    assert "norms: 3 generations" in capsys.readouterr().out


def test_unknown_variant_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="unknown variant"):
        main(["--smoke", "--variants", "nope", "--out", str(tmp_path)])


def test_the_signal_standard_error_matches_its_spread_under_pure_isotropic_noise():
    """No signal, Gaussian noise in D dimensions: the signal estimates of independent R-sets spread as
    signal_resolution's standard error says, and about 5% of them count as resolved (one-sided 95%)."""
    from esopt.experiments.es_signal import signal_resolution
    from esopt.experiments.variance import ProjectionStats

    dim, r, sets = 500, 8, 300
    g = torch.Generator().manual_seed(0)
    signals, resolved, ses = [], 0, []
    for _ in range(sets):
        stats = ProjectionStats(dim, directions=2, seed=0)
        for _ in range(r):
            stats.add(torch.randn(dim, generator=g, dtype=torch.float64))
        row = stats.result()
        trace_sq = (sum(row["sq_norms"]) - r * row["mean_sq_norm"]) / (r - 1)
        signals.append(row["mean_sq_norm"] - trace_sq / r)  # unclipped
        row.update(numel=dim, dimension=dim)
        res = signal_resolution(row)
        ses.append(res["signal_se"])
        resolved += res["resolved"]
    spread = float(torch.tensor(signals).std())
    se = float(torch.tensor(ses).mean())
    assert 0.85 * se < spread < 1.15 * se, (spread, se)
    assert resolved / sets < 0.1 and math.isfinite(se)
