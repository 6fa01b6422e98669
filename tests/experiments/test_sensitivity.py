"""`esopt analyze sensitivity`: the pair gap is the member's noise seen through the reward, so with a reward
linear in one weight matrix it is exactly 2 sigma |<eps, u>| (doubling sigma doubles it), and it is zero when
the scope leaves that matrix out."""

import pytest
import torch

from esopt.experiments.sensitivity import main, probe
from esopt.train.config import build_config
from tests.train.test_train_es import TINY


@pytest.fixture
def linear_reward(monkeypatch):
    from esopt.rollout import RolloutSpec, RolloutStats, Trajectory

    probe_state: dict = {}

    def rollout(self, policy, make, task_seeds, seed, **kwargs):
        param = policy.model.model.layers[0].mlp.up_proj.weight
        u = probe_state.setdefault("u", torch.randn(param.shape, generator=torch.Generator().manual_seed(5)))
        value = float((param.detach() * u).sum())
        return [Trajectory(task_seed=s, reward=value) for s in task_seeds], RolloutStats(episodes=len(task_seeds))

    monkeypatch.setattr(RolloutSpec, "run", rollout)


def test_pair_gap_is_linear_in_sigma_and_zero_outside_the_scope(linear_reward):
    config = build_config({}, [*TINY, "es.reward=env"])
    rows = probe(config, [1e-3, 2e-3])
    full = sum(p.numel() for p in _model_params(config))
    assert [r["pair_disagreement"] for r in rows] == [1.0, 1.0]
    assert rows[0]["pair_gap"] > 0
    assert rows[1]["pair_gap"] == pytest.approx(2 * rows[0]["pair_gap"], rel=1e-3)
    assert rows[0]["dimension"] == full
    outside = build_config({}, [*TINY, "es.reward=env", "es.scope=regex", "es.scope_pattern=self_attn"])
    rows = probe(outside, [1e-3])
    assert rows[0]["pair_disagreement"] == 0.0 and rows[0]["pair_gap"] == 0.0
    assert 0 < rows[0]["dimension"] < full


def _model_params(config):
    from esopt.train.models import load_model

    return list(load_model(config.model, config.env.kwargs).model.parameters())


@pytest.mark.slow
def test_smoke_command_writes_its_table(tmp_path):
    assert main(["--smoke", "--sigmas", "1e-3", "5e-2", "--out", str(tmp_path), "--quiet"]) == 0
    text = (tmp_path / "sensitivity.md").read_text()
    assert "| 0.001 |" in text and "| 0.05 |" in text and (tmp_path / "sensitivity.json").exists()


def test_bad_sigma_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="--sigmas must be positive"):
        main(["--smoke", "--sigmas", "0", "--out", str(tmp_path), "--quiet"])


@pytest.mark.slow
def test_es_variants_smoke_reports_each_variant_against_base_and_baseline(tmp_path):
    """`esopt bench es-variants` runs each registered variant as the horizon bench's ES run with its options, and
    the report pairs each with the base model and with the baseline variant on the same validation tasks."""
    import yaml

    from esopt.experiments.es_variants import main as variants_main

    out = tmp_path / "v"
    assert variants_main(["--smoke", "--only", "baseline", "subspace-r1", "--out", str(out)]) == 0
    run = out / "subspace-r1" / "horizon" / "es_h1_s0"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["es"]["noise"] == "subspace" and config["eval"]["split"] == "validation"
    rows = [line for line in (out / "es_variants.md").read_text().splitlines() if line.startswith("| subspace-r1")]
    assert len(rows) == 1 and rows[0].count("[") == 2  # an interval against the base and one against baseline
    with pytest.raises(ValueError, match="unknown variant"):
        variants_main(["--smoke", "--only", "nope", "--out", str(out)])
    # running one more variant keeps the rows of those already in OUT
    assert variants_main(["--smoke", "--only", "no-antithetic", "--out", str(out)]) == 0
    names = [line.split(" | ")[0][2:] for line in (out / "es_variants.md").read_text().splitlines()
             if line.startswith("| ") and not line.startswith(("| variant", "|---"))]
    assert names == ["baseline", "subspace-r1", "no-antithetic"]
    # another session's seed, in its own out dir, pooled into one report; the variant with seed 0 only is
    # paired with the baseline on seed 0 alone, and says so
    other, pooled = tmp_path / "s1", tmp_path / "pooled"
    assert variants_main(["--smoke", "--only", "baseline", "--seeds", "1", "--out", str(other)]) == 0
    assert variants_main(["--smoke", "--only", "baseline", "subspace-r1", "--seeds", "0", "1", "--report-only",
                          "--out", str(pooled), "--also", str(out), str(other)]) == 0
    lines = (pooled / "es_variants.md").read_text().splitlines()
    table = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines
             if line.startswith(("| baseline", "| subspace-r1"))}
    assert table["baseline"][2] == "0,1" and table["subspace-r1"][2] == "0"
    assert float(table["subspace-r1"][4]) < float(table["baseline"][4])  # each row's D from its own config
    assert table["subspace-r1"][8].endswith("(seeds 0)")


def test_wide_population_variants_keep_the_episode_budget_in_fewer_generations():
    """G x E beyond one generation's 32 episodes: fewer generations, the same episodes in all, and the
    smollm2 plan's other settings unchanged; a G x E that cannot split the budget is a clear error."""
    import argparse
    from dataclasses import replace

    from esopt.experiments import es_variants
    from esopt.experiments.horizon import run_config

    def plans(*names):
        args = argparse.Namespace(only=list(names), h_stars=[1], seeds=[0], eval_tasks=256, smoke=False,
                                  overrides=[])
        return es_variants.variant_plans(args)

    shapes = {}
    for name, plan in plans("baseline", "G32xE1", "G64xE1", "G128xE1", "G32xE4", "G64xE2", "G64xE4").items():
        c = run_config(plan, "es", 1, 0)
        shapes[name] = (c.steps, c.es.population_size, c.es.tasks_per_member)
        assert c.eval.split == "validation" and c.es.sigma == 4e-3
        assert c.steps * c.episodes_per_step == 256  # every shape spends the baseline's episodes
    assert shapes == {"baseline": (8, 8, 4), "G32xE1": (8, 32, 1), "G64xE1": (4, 64, 1), "G128xE1": (2, 128, 1),
                      "G32xE4": (2, 32, 4), "G64xE2": (2, 64, 2), "G64xE4": (1, 64, 4)}
    bad = replace(es_variants.VARIANTS["G64xE1"], population=96)
    es_variants.VARIANTS["G96-test"] = bad
    try:
        with pytest.raises(ValueError, match="do not split"):
            plans("G96-test")
    finally:
        del es_variants.VARIANTS["G96-test"]


def test_config_file_mode_probes_that_config_and_rejects_a_non_es_one(tmp_path, linear_reward):
    """--config probes a training config file (any env) with --set on top, as `esopt train` reads it."""
    import json

    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"algo": "es", "seed": 3, "model": {"name": "tiny-sudoku",
                                                                        "warm_start_steps": 60}}))
    out = tmp_path / "out"
    assert main(["--config", str(path), "--sigmas", "1e-3", "2e-3", "--set", "es.reward=env",
                 "es.population_size=4", "es.tasks_per_member=2", "--out", str(out), "--quiet"]) == 0
    data = json.loads((out / "sensitivity.json").read_text())
    assert data["config"]["seed"] == 3 and data["config"]["es"]["population_size"] == 4
    rows = data["rows"]
    assert rows[1]["pair_gap"] == pytest.approx(2 * rows[0]["pair_gap"], rel=1e-3)  # the linear reward, as above
    assert "tiny-sudoku" in (out / "sensitivity.md").read_text()
    grpo = tmp_path / "grpo.yaml"
    grpo.write_text(yaml.safe_dump({"algo": "grpo"}))
    with pytest.raises(ValueError, match="needs algo: es"):
        main(["--config", str(grpo), "--out", str(out), "--quiet"])
