"""The analyses behind results/pretrained_gain.md, at smoke size on the tiny model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from esopt.es import ParamScope, read_history, select_parameters, update_coefficients
from esopt.experiments import calibrate, gain, neighbourhood
from esopt.train.config import build_config, load_config
from esopt.train.es import train
from esopt.train.models import load_model


def test_mcnemar_by_hand():
    assert gain.mcnemar_p([0] * 5, [1] * 5) == pytest.approx(2 / 32)  # 5 discordant pairs, all one way
    assert gain.mcnemar_p([1, 0, 1, 0], [0, 1, 1, 0]) == 1.0
    assert gain.mcnemar_p([1, 1], [1, 1]) == 1.0


def test_permuted_records_keep_each_generations_coefficients():
    record = {"seeds": [5, 5, 9, 9, 4, 4], "signs": [1, -1, 1, -1, 1, -1], "weights": [1.0, -1.0, 0.5, 0.2, 0, 2],
              "alpha": 0.1, "population_size": 6}
    (shuffled,) = gain.permuted_records([record], seed=0)
    original, permuted = update_coefficients(record), update_coefficients(shuffled)
    assert set(permuted) == set(original)
    assert sorted(permuted.values()) == sorted(original.values())
    assert shuffled["population_size"] == 6 and shuffled["alpha"] == 0.1


@pytest.mark.slow
def test_calibrate_neighbourhood_and_gain_smoke(tmp_path, capsys):
    tiny = ["model.name=tiny-sudoku", "model.warm_start_steps=60", "sampling.max_new_tokens=10"]
    assert calibrate.main(["--smoke", "--set", *tiny, "--quiet", "--out", str(tmp_path)]) == 0
    cal = json.loads((tmp_path / "calibration.json").read_text())
    assert [(r["size"], r["h_star"], r["temperature"]) for r in cal["rows"]] == [(4, 2, 0.0)]
    assert 0 <= cal["rows"][0]["valid_action_rate"] <= 1

    assert neighbourhood.main(["--smoke", "--set", *tiny, "--quiet", "--out", str(tmp_path)]) == 0
    nb = json.loads((tmp_path / "neighbourhood.json").read_text())
    (row,) = nb["rows"]
    assert len(row["train_scores"]) == 2 and len(row["rescored"]) == 1
    assert row["rescored"][0]["train"] == max(row["train_scores"])  # the best member is the one re-scored

    opts = ["steps=2", *tiny, "env.kwargs.h_star=3", "eval.tasks=4", "eval.every=0", "es.population_size=4",
            "es.antithetic=true", "es.tasks_per_member=4", "es.sigma=0.05", "es.sigma_min=0.01", "es.alpha=0.02",
            "es.reward=shaped", "measure_inference_peak=false"]
    run = tmp_path / "run-s0"
    train(build_config({}, opts), run, progress=False)
    argv = ["--runs", str(run), "--episodes", "6", "--temperatures", "0", "0.7", "--validation-episodes", "4",
            "--quiet", "--out", str(tmp_path)]
    assert gain.main(argv) == 0
    result = json.loads((tmp_path / "gain.json").read_text())
    names = [r["name"] for r in result["rows"]]
    assert names == ["base", "base@T*", "es-run-s0", "random-run-s0"]
    # both steps have the length sqrt(d * sum_g (alpha_g / G)^2 * sum_seed c^2) of a sum of independent
    # N(0, I_d) draws (to ~1/sqrt(d) = 0.1%): the random control only reassigns the coefficients to the seeds
    records = read_history(run / "history.jsonl")
    config = load_config(run / "config.yaml")
    d = sum(p.numel() for _, p in select_parameters(load_model(config.model, config.env.kwargs).model,
                                                     ParamScope(**records[0]["scope"])))
    assert all(r["weight_decay"] == 0 for r in records) and d > 10**5
    length = math.sqrt(d * sum((r["alpha"] / r["population_size"]) ** 2 * sum(c * c for c in
                                                                             update_coefficients(r).values())
                               for r in records))
    assert length > 0
    assert result["norms"]["es-run-s0"] == pytest.approx(length, rel=0.02)
    assert result["norms"]["random-run-s0"] == pytest.approx(length, rel=0.02)
    base_row = result["rows"][0]
    assert base_row["d_success"] == [0.0, 0.0, 0.0] and base_row["mcnemar_p"] == 1.0
    assert "| base@T*=" in (tmp_path / "gain.md").read_text()
    # a rerun reuses the cached evaluations and gives the same table
    before = (tmp_path / "gain.md").read_text()
    assert gain.main(argv) == 0 and (tmp_path / "gain.md").read_text() == before
    assert np.isfinite([r["success"] for r in result["rows"]]).all()

    # test-time compute row: the base, best of 2 sampled episodes per task (the verifier keeps the best)
    assert gain.main([*argv, "--best-of", "2"]) == 0
    result = json.loads((tmp_path / "gain.json").read_text())
    row = next(r for r in result["rows"] if r["name"] == "base best-of-2")
    sampled = json.loads((tmp_path / "gain_evals" / "base-test-T0.7-x2.json").read_text())["episode_success"]
    assert row["success"] == sum(max(sampled[i], sampled[6 + i]) for i in range(6)) / 6

    # Mean@2 / Pass@2 for the base and the ES run, paired per task (the base's sampled eval is reused)
    assert gain.main([*argv, "--samples", "2"]) == 0
    result = json.loads((tmp_path / "gain.json").read_text())
    base_k, es_k = result["sampled_rows"]
    assert (base_k["name"], es_k["name"]) == ("base", "es-run-s0")
    assert base_k["pass_at_k"] == row["success"] and base_k["mean_at_k"] == sum(sampled) / 12
    es_sampled = json.loads((tmp_path / "gain_evals" / "es-run-s0-test-T0.7-x2.json").read_text())["episode_success"]
    assert es_k["d_mean"][0] == pytest.approx(sum(es_sampled) / 12 - sum(sampled) / 12)
    assert "| model | Mean@2 |" in (tmp_path / "gain.md").read_text()


def test_best_of_takes_the_verifiers_pick_per_task():
    ev = {"episode_success": [0, 1, 0, 1, 0, 0], "episode_shaped": [0.1, 0.9, 0.3, 0.8, 0.2, 0.0]}
    best = gain.best_of(ev, samples=2, tasks=3)
    assert best["episode_success"] == [1, 1, 0] and best["episode_shaped"] == [0.8, 0.9, 0.3]
    assert best["success_rate"] == 2 / 3


def test_gain_by_group_pairs_each_kind_of_task_with_the_base():
    labels = ["click-test", "enter-text"] * 4  # 8 tasks, one episode each, two kinds
    base = {"episode_success": [1, 0, 1, 0, 1, 0, 1, 0], "episode_labels": {"task": labels}}
    es = {"episode_success": [1, 1, 1, 1, 0, 1, 1, 0]}
    result = {"evals": {"base": base, "es-s0": es}, "episodes": 8}
    rows = {r["group"]: r for r in gain.group_rows(result, "task")}
    assert rows["click-test"]["models"]["base"]["success"] == 1.0
    assert rows["click-test"]["models"]["es-s0"]["success"] == 0.75
    assert rows["enter-text"]["models"]["es-s0"]["success"] == 0.75
    assert rows["enter-text"]["models"]["es-s0"]["d_success"][0] == pytest.approx(0.75)
    assert rows["click-test"]["models"]["es-s0"]["d_success"][0] == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="carry no 'tier' label"):
        gain.group_rows(result, "tier")


def test_eval_records_the_env_labels_of_each_episode():
    from esopt.rollout.trajectory import Trajectory, Turn
    from esopt.train.evaluate import episode_labels

    def episode(info):
        t = Trajectory(task_seed=0)
        t.turns.append(Turn(prompt="", prompt_ids=[], token_ids=[], text="", logprobs=None, reward=0.0,
                            terminated=True, truncated=False, info=info))
        return t

    labelled = [episode({"task": "click-test"}), episode({"template": "x"}), Trajectory(task_seed=1)]
    assert episode_labels(labelled) == {"task": ["click-test", "", ""], "template": ["", "x", ""]}
    assert episode_labels([episode({})]) == {}

