"""The horizon benchmark (ES vs GRPO vs PPO, matched budgets) and the gradient-variance analysis, end to end
on their smoke presets, plus the pure helpers on synthetic data."""

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import torch

from esopt.cli import main as cli_main
from esopt.experiments import horizon, variance
from esopt.models import model_dtype
from esopt.train.config import load_config
from tests.pause import kill_when_parked
from tests.tolerance import reduction_rtol


def test_projection_stats_recover_a_known_variance():
    # g_r = mu + s * z_r, z ~ N(0, I): any unit direction has Var(u.g) = s^2, trace(Cov)/D = s^2
    dim, s, reps = 64, 0.5, 400
    gen = torch.Generator().manual_seed(1)
    mu = torch.randn(dim, generator=gen)
    stats = variance.ProjectionStats(dim, directions=32, seed=0)
    for _ in range(reps):
        stats.add(mu + s * torch.randn(dim, generator=gen))
    r = stats.result()
    assert r["repeats"] == reps
    assert abs(r["var"] - s**2) < 0.15 * s**2
    assert abs(r["trace_per_dim"] - s**2) < 0.05 * s**2
    signal = float(mu.square().sum())
    assert abs(r["signal_sq"] - signal) < 0.1 * signal
    assert abs(r["nsr"] - dim * s**2 / signal) < 0.15 * dim * s**2 / signal
    assert math.isclose(r["rel_var"], r["var"] / (r["mean_sq_norm"] / dim))
    # |g|^2 = |mu|^2 + 2 s mu.z + s^2 |z|^2 has variance 4 s^2 |mu|^2 + 2 s^4 D
    se = math.sqrt((4 * s**2 * signal + 2 * s**4 * dim) / reps) / dim
    assert abs(r["trace_se_per_dim"] - se) < 0.2 * se and len(r["sq_norms"]) == reps
    u = variance.random_directions(dim, 8, seed=3)
    assert torch.allclose(u.norm(dim=1), torch.ones(8)) and torch.equal(u, variance.random_directions(dim, 8, seed=3))
    # a zero-mean estimator: its signal is not resolved, never a huge finite ratio
    zero = variance.ProjectionStats(4, 2, 0)
    zero.add(torch.tensor([1.0, 0, 0, 0]))
    zero.add(torch.zeros(4))
    assert zero.result()["nsr"] == math.inf


def test_chunked_directions_project_like_the_dense_ones():
    # blocks of 7 over 30 coordinates (a ragged last block): the same unit directions, regenerated per use
    dirs = variance.RandomDirections(30, 5, seed=2, chunk=7)
    u = dirs.dense()
    assert u.shape == (5, 30) and torch.allclose(u.norm(dim=1), torch.ones(5))
    g = torch.randn(30, generator=torch.Generator().manual_seed(0))
    # two orders of a 30-term fp32 dot product (blocks of 7 summed in fp64, and whole rows), plus the normalisation:
    # Higham's bound relative to the sum of the terms' magnitudes
    bound = reduction_rtol(torch.float32, 30 + 1) * (u.abs() @ g.abs())
    assert ((dirs.project(g).float() - u @ g).abs() <= bound).all()
    assert torch.equal(variance.RandomDirections(30, 5, seed=2, chunk=7).dense(), u)
    assert not torch.equal(variance.RandomDirections(30, 5, seed=3, chunk=7).dense(), u)


def test_fits_recover_slopes_and_baselines_center():
    hs = [2, 4, 6, 8]
    f = variance.fits(hs, [0.3 * h for h in hs])  # var linear in H*: exponent 1
    assert math.isclose(f["log_var_vs_log_h"]["slope"], 1.0, rel_tol=1e-9)
    assert math.isclose(f["var_vs_h"]["slope"], 0.3, rel_tol=1e-9)
    f = variance.fits(hs, [math.exp(0.5 * h) for h in hs])
    assert math.isclose(f["log_var_vs_h"]["slope"], 0.5, rel_tol=1e-9) and math.isclose(f["log_var_vs_h"]["r2"], 1.0)
    adv = variance.baseline_advantages([1.0, 3.0, 0.0, 2.0], group=2)
    assert adv.tolist() == [-1.0, 1.0, -1.0, 1.0]
    assert variance.baseline_advantages([1.0, 3.0, 0.0, 2.0], group=1).tolist() == [-0.5, 1.5, -1.5, 0.5]


def test_horizon_plan_options_and_matched_budget_checks():
    parse = horizon.build_parser().parse_args
    plan = horizon.plan_from_args(parse(["--size", "smoke"]))  # preset alias
    assert plan.steps == horizon.PRESETS["smoke"]["steps"] and plan.size == 4
    plan = horizon.plan_from_args(parse(["--size", "6", "--episodes-per-step", "48", "--population", "12",
                                         "--group-size", "6", "--methods", "es", "ppo", "--set", "es.sigma=0.01"]))
    assert plan.size == 6 and plan.methods == ["es", "ppo"]
    configs = {m: horizon.run_config(plan, m, 10, 0) for m in horizon.METHODS}
    assert {m: c.episodes_per_step for m, c in configs.items()} == {"es": 48, "grpo": 48, "ppo": 48}
    assert configs["es"].es.sigma == 0.01 and configs["es"].es.tasks_per_member == 4
    assert configs["grpo"].grpo.tasks_per_step == 8 and configs["ppo"].ppo.tasks_per_step == 48
    assert len({c.sampling.model_dump_json() for c in configs.values()}) == 1
    assert configs["ppo"].env.kwargs["size"] == 6
    for bad in (["--episodes-per-step", "30"], ["--population", "5"], ["--h-stars", "17"], ["--size", "big"]):
        with pytest.raises(ValueError):
            horizon.plan_from_args(parse(bad))
    with pytest.raises(ValueError, match="matched"):  # an override must not unmatch the budget
        horizon.run_config(horizon.plan_from_args(parse(["--set", "es.population_size=4"])), "es", 5, 0)
    # matched FLOPs: ES's members grow by GRPO's factor over ES's, (2 + 6 x epochs + 2 KL) / 2; the rest stays
    flops = horizon.plan_from_args(parse(["--budget", "flops"]))
    configs = {m: horizon.run_config(flops, m, 5, 0) for m in horizon.METHODS}
    m = flops.episodes_per_step
    # PPO's step passes cost (2 + 6 x 2 epochs + 2 old log-probs + 2 KL) + critic (2 + 6 x 2) = 32 per token:
    # it gets the episodes whose passes cost what ES's 5m forward-only episodes cost
    assert {k: c.episodes_per_step for k, c in configs.items()} == {"es": 5 * m, "grpo": m,
                                                                     "ppo": round(5 * m * 2 / 32)}
    assert configs["es"].es.population_size == 5 * flops.population
    assert configs["es"].es.tasks_per_member == m // flops.population
    more = horizon.plan_from_args(parse(["--budget", "flops", "--set", "grpo.epochs=2", "grpo.kl_beta=0"]))
    assert horizon.matched_flops_scale(more) == (2 + 12 + 2) // 2  # 2 epochs reuse samples: old log-probs
    assert horizon.run_config(more, "ppo", 5, 0).episodes_per_step == round(8 * m * 2 / 32)
    one_epoch = horizon.plan_from_args(parse(["--budget", "flops", "--set", "ppo.epochs=1"]))
    assert horizon.run_config(one_epoch, "ppo", 5, 0).episodes_per_step == round(5 * m * 2 / (12 + 8))
    assert "matched estimated model FLOPs" in horizon.budget_text(flops) and "PPO 10 " in horizon.budget_text(flops)
    assert horizon.budget_title(flops).endswith("ES 160, GRPO 32, PPO 10")  # the plots' title names every method
    with pytest.raises(SystemExit):
        parse(["--budget", "tokens"])


def test_horizon_plan_on_the_pretrained_model_with_hints():
    """`--model smollm2` with a hint level: every method's config names SmolLM2 (no warm start), carries the
    env settings to all three methods and keeps the matched episode budget."""
    args = horizon.build_parser().parse_args(["--preset", "smoke", "--model", "smollm2", "--set",
                                              "env.kwargs.hints=candidates", "env.few_shot=2", "grpo.lr=3e-6"])
    plan = horizon.plan_from_args(args)
    configs = {m: horizon.run_config(plan, m, 2, 0) for m in horizon.METHODS}
    for config in configs.values():
        assert config.model.name == "smollm2" and config.model.resolved_dtype == model_dtype("smollm2", "auto", "cpu")
        assert config.env.kwargs["hints"] == "candidates" and config.env.few_shot == 2
        assert config.episodes_per_step == plan.episodes_per_step
    assert configs["grpo"].grpo.lr == 3e-6 and configs["ppo"].ppo.lr != 3e-6  # method keys stay with their method


def test_paired_table_against_the_base_and_between_methods():
    """Hand-made evals: ES turns 4 of 8 failures into successes (McNemar: 4 discordant pairs one way,
    p = 2/16); GRPO changes nothing; ES - GRPO is then ES - base."""
    plan = horizon.Plan(**{**horizon.PRESETS["smoke"], "h_stars": [2], "eval_tasks": 8, "methods": ["es", "grpo"]})
    base = {"episode_success": [0, 0, 0, 0, 1, 1, 1, 1], "valid_action_rate": 0.5, "correct_given_valid": 0.25}
    trained = {**base, "episode_success": [1] * 8, "valid_action_rate": 0.75}

    def run(method, after):
        return horizon.RunResult(method, 2, 0, {"eval_before": base, "eval_after": after}, [], [], 8, None)

    lines = horizon.paired_lines(plan, [run("es", trained), run("grpo", base)])
    es_row = next(line for line in lines if line.startswith("| 2 | ES | 8 |"))
    assert "1.000 (base 0.500)" in es_row and "| +0.500 [" in es_row and "| 0.125 |" in es_row
    assert "| 0.750 (0.500) |" in es_row
    grpo_row = next(line for line in lines if line.startswith("| 2 | GRPO | 8 |"))
    assert "+0.000 [+0.000, +0.000]" in grpo_row and "| 1 |" in grpo_row
    duel = next(line for line in lines if "ES vs GRPO" in line)
    assert "+0.500 [" in duel and "| 0.125 |" in duel


def test_es_is_compared_with_a_baseline_on_the_seeds_both_ran():
    """ES ran seeds 0 and 1, PPO only seed 1: the duel pairs ES's seed 1 with PPO's seed 1 (not seed 0 with
    seed 1, nor skipped), and says which seed it used."""
    plan = horizon.Plan(**{**horizon.PRESETS["smoke"], "h_stars": [2], "eval_tasks": 8, "seeds": [0, 1],
                           "methods": ["es", "ppo"]})
    base = {"episode_success": [0] * 8, "valid_action_rate": 0.5, "correct_given_valid": 0.25}

    def run(method, seed, successes):
        return horizon.RunResult(method, 2, seed, {"eval_before": base, "eval_after": {**base, "episode_success":
                                                                                     successes}}, [], [], 8, None)

    lines = horizon.paired_lines(plan, [run("es", 0, [1] * 8), run("es", 1, [0] * 8), run("ppo", 1, [1] * 4 + [0] * 4)])
    duel = next(line for line in lines if "ES vs PPO" in line)
    assert "ES vs PPO (seed 1)" in duel and "| -0.500 [" in duel and "| 0.125 |" in duel
    both = horizon.paired_lines(plan, [run("es", 0, [1] * 8), run("es", 1, [0] * 8),
                                       run("ppo", 0, [0] * 8), run("ppo", 1, [0] * 8)])
    assert "| 2 | ES vs PPO | +0.500 [" in next(line for line in both if "ES vs PPO" in line)


@pytest.mark.slow
def test_horizon_smoke_runs_every_method_with_matched_budgets(tmp_path, monkeypatch):
    import esopt.train.loop as loop
    from esopt.rollout import RolloutSpec

    current, episodes = {"eval": False}, Counter()  # training episodes rolled out, per run

    def counted(self, policy, make, task_seeds, seed, _orig=RolloutSpec.run, **kwargs):
        if not current["eval"]:  # training rollouts only, not the held-out evals
            episodes[current["run"]] += len(task_seeds)
        return _orig(self, policy, make, task_seeds, seed, **kwargs)

    def evaluate(*args, _orig=loop.evaluate, **kwargs):
        current["eval"] = True
        try:
            return _orig(*args, **kwargs)
        finally:
            current["eval"] = False

    monkeypatch.setattr(RolloutSpec, "run", counted)
    monkeypatch.setattr(loop, "evaluate", evaluate)
    import esopt.experiments.sweep as sweep

    orig_train = sweep.train_in_process

    def train_one(run, resume, progress):
        current["run"] = run.name
        return orig_train(run, resume, progress)

    monkeypatch.setattr(sweep, "train_in_process", train_one)

    assert horizon.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    plan = horizon.Plan(**horizon.PRESETS["smoke"])
    md = (tmp_path / "horizon.md").read_text()
    assert (tmp_path / "horizon.png").stat().st_size > 0
    assert "Held-out success" in md and "Peak memory" in md and "generated tokens/step" in md
    names = {horizon.run_name(m, h, s) for m in horizon.METHODS for h in plan.h_stars for s in plan.seeds}
    assert names == {p.name for p in (tmp_path / "horizon").iterdir()}
    for name in names:
        run = tmp_path / "horizon" / name
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps_done"] == plan.steps and summary["eval_after"] is not None
        assert (run / "plots" / "eval.png").exists()
        # matched budget: from the config, and from the episodes really rolled out in training
        assert load_config(run / "config.yaml").episodes_per_step == plan.episodes_per_step
        assert episodes[name] == plan.steps * plan.episodes_per_step, name
    results = horizon.load_results(plan, [tmp_path])
    assert {r.episodes_per_step for r in results} == {plan.episodes_per_step}
    # the learning curve: validation success before the first step and after each
    assert all([step for step, _ in r.curve] == list(range(plan.steps + 1)) for r in results)
    # same sampling for every method
    assert len({load_config(tmp_path / "horizon" / n / "config.yaml").sampling.model_dump_json()
                for n in names}) == 1

    # a run that ran elsewhere: --runs-from reports it as if it were under --out; without it, it is missing
    elsewhere = tmp_path / "elsewhere" / "horizon"
    elsewhere.mkdir(parents=True)
    moved = horizon.run_name("ppo", plan.h_stars[-1], plan.seeds[0])
    (tmp_path / "horizon" / moved).rename(elsewhere / moved)
    report_only = ["--preset", "smoke", "--out", str(tmp_path), "--report-only"]
    assert horizon.main(report_only) == 0 and (tmp_path / "horizon.md").read_text() != md
    assert horizon.main([*report_only, "--runs-from", str(elsewhere.parent)]) == 0
    assert (tmp_path / "horizon.md").read_text() == md
    assert cli_main(["bench", "horizon", *report_only, "--runs-from", str(tmp_path / "nowhere")]) == 2
    (elsewhere / moved).rename(tmp_path / "horizon" / moved)

    # --resume skips finished runs; without it an existing run directory is an error, not an overwrite
    assert horizon.main(["--preset", "smoke", "--out", str(tmp_path), "--resume", "--methods", "es"]) == 0
    assert cli_main(["bench", "horizon", "--preset", "smoke", "--out", str(tmp_path)]) == 2
    # runs at once need a process each
    assert cli_main(["bench", "horizon", "--preset", "smoke", "--jobs", "2", "--out", str(tmp_path / "j")]) == 2
    assert not (tmp_path / "j").exists()

    # --budget flops: ES rolls out 5x GRPO's episodes per step (G x 5 members, same tasks each), and says so
    episodes.clear()
    assert horizon.main(["--preset", "smoke", "--out", str(tmp_path / "f"), "--methods", "es", "--h-stars", "1",
                         "--budget", "flops"]) == 0
    assert episodes[horizon.run_name("es", 1, 0)] == plan.steps * plan.episodes_per_step * 5
    assert "matched estimated model FLOPs" in (tmp_path / "f" / "horizon.md").read_text()
    assert (tmp_path / "f" / "horizon_wallclock.png").stat().st_size > 0


@pytest.mark.slow
def test_variance_smoke_gives_finite_variances_and_slopes(tmp_path, capsys):
    assert cli_main(["analyze", "variance", "--smoke", "--quiet", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "variance.json").read_text())
    assert (tmp_path / "variance.md").exists() and (tmp_path / "variance.png").stat().st_size > 0
    smoke = variance.Setup(**variance.SMOKE)
    assert {(r["method"], r["h_star"]) for r in result["rows"]} == {(m, h) for m in variance.METHODS
                                                                    for h in smoke.h_stars}
    for r in result["rows"]:
        assert math.isfinite(r["var"]) and r["var"] > 0, r
        assert r["episodes_per_estimate"] == (smoke.batch if r["method"] == "pg"
                                              else smoke.members * smoke.member_episodes)
    for m in variance.METHODS:
        f = result["fits"][m]["var"]
        assert math.isfinite(f["log_var_vs_h"]["slope"]) and math.isfinite(f["var_vs_h"]["slope"]), f
    assert cli_main(["analyze", "nope"]) == 2
    assert not (tmp_path / "variance_state").exists()  # removed once the run is written

    # killed (SIGKILL) after two repetitions of the second H*, resumed: the uninterrupted run's rows
    killed, pause = tmp_path / "killed", tmp_path / "pause"
    pause.mkdir()
    args = ["analyze", "variance", "--smoke", "--quiet", "--out", str(killed)]
    proc = subprocess.Popen([sys.executable, "-m", "esopt.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1",
                            "ESOPT_PAUSE_AT": f"variance@{smoke.repeats + 2}", "ESOPT_PAUSE_DIR": str(pause)})
    assert kill_when_parked(proc, "variance", pause)["h_star"] == smoke.h_stars[1]
    assert sorted(p.name for p in (killed / "variance_state").iterdir()) == [
        f"h{smoke.h_stars[0]}.json", f"h{smoke.h_stars[1]}.pt", "setup.json"]
    # --peek reads what is saved, touching nothing: the finished H* as the whole run has it, the H* in progress
    # as a run of 2 repetitions has it (repetitions are seeded by index)
    saved = {p.name: p.stat().st_mtime_ns for p in (killed / "variance_state").iterdir()}
    peeked = variance.peek(killed)
    assert peeked["in_progress"] == {smoke.h_stars[1]: 2}
    assert [r for r in peeked["rows"] if r["h_star"] == smoke.h_stars[0]] == [
        r for r in result["rows"] if r["h_star"] == smoke.h_stars[0]]
    assert cli_main(["analyze", "variance", "--smoke", "--quiet", "--h-stars", str(smoke.h_stars[1]), "--repeats",
                     "2", "--out", str(tmp_path / "two")]) == 0
    two = json.loads((tmp_path / "two" / "variance.json").read_text())
    assert [r for r in peeked["rows"] if r["h_star"] == smoke.h_stars[1]] == two["rows"]
    assert cli_main(["analyze", "variance", "--peek", str(killed)]) == 0
    assert f"H*={smoke.h_stars[1]} after 2 of {smoke.repeats} repetitions" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in (killed / "variance_state").iterdir()} == saved
    assert not (killed / "variance.json").exists()
    assert cli_main(["analyze", "variance", "--peek", str(killed), "--sigma", "0.1"]) == 2  # measures nothing
    with pytest.raises(ValueError, match="no saved run there"):
        variance.peek(tmp_path / "two")
    # only finished H* saved (the next one's first repetition not yet): their rows, and still marked preliminary
    shutil.copytree(killed / "variance_state", tmp_path / "first" / "variance_state")
    (tmp_path / "first" / "variance_state" / f"h{smoke.h_stars[1]}.pt").unlink()
    first = variance.peek(tmp_path / "first")
    assert first["in_progress"] == {} and first["rows"] == [r for r in peeked["rows"]
                                                            if r["h_star"] == smoke.h_stars[0]]
    assert "the finished H* only" in variance.report(first)
    with pytest.raises(ValueError, match="holds an unfinished run: pass --resume"):
        variance.main(args[2:])  # the saved work is kept
    with pytest.raises(ValueError, match="started with another sigma"):
        variance.main([*args[2:], "--resume", "--sigma", "0.02"])
    # a run saved in another dtype (SmolLM2 is bf16 on a CPU with native bf16, fp32 on others) is not continued
    setup_file = killed / "variance_state" / "setup.json"
    key = json.loads(setup_file.read_text())
    assert key["dtype"] == result["setup"]["dtype"] == "float32"
    setup_file.write_text(json.dumps({**key, "dtype": "bfloat16"}))
    with pytest.raises(ValueError, match="started with another dtype"):
        variance.main([*args[2:], "--resume"])
    setup_file.write_text(json.dumps(key))
    with pytest.raises(ValueError, match=rf"holds work at H\*=\[{smoke.h_stars[0]}\]"):  # would be deleted
        variance.main([*args[2:], "--resume", "--h-stars", str(smoke.h_stars[1])])
    assert cli_main([*args, "--resume"]) == 0
    resumed = json.loads((killed / "variance.json").read_text())
    assert resumed["rows"] == result["rows"] and resumed["fits"] == result["fits"]
    assert not (killed / "variance_state").exists()
    # a removal cut short (setup.json goes first) leaves files that a new run clears, never reuses
    (killed / "variance_state").mkdir()
    (killed / "variance_state" / f"h{smoke.h_stars[0]}.json").write_text('{"rows": [], "seconds": 0}')
    variance.RunState(killed / "variance_state", smoke, resume=False)
    assert not (killed / "variance_state").exists()

    # the same setup run one H* at a time, then merged: the single run's rows and fits, exactly
    for h in smoke.h_stars:
        assert cli_main(["analyze", "variance", "--smoke", "--quiet", "--h-stars", str(h),
                         "--out", str(tmp_path / f"h{h}")]) == 0
    parts = [str(tmp_path / f"h{h}") for h in reversed(smoke.h_stars)]
    assert cli_main(["analyze", "variance", "--merge", *parts, "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "variance.json").read_text())
    assert merged["rows"] == result["rows"] and merged["fits"] == result["fits"]
    assert merged["setup"] == result["setup"] and merged["merged_from"] == parts
    # a merge that would mix setups or count an H* twice is refused
    assert cli_main(["analyze", "variance", "--merge", parts[0], parts[0], "--out", str(tmp_path / "x")]) == 2
    assert cli_main(["analyze", "variance", "--merge", *parts, "--h-stars", "3", "--out", str(tmp_path / "x")]) == 2
    (tmp_path / "list.json").write_text("[1]")
    assert cli_main(["analyze", "variance", "--merge", parts[0], str(tmp_path / "list.json"),
                     "--out", str(tmp_path / "x")]) == 2
    other = json.loads((tmp_path / f"h{smoke.h_stars[0]}" / "variance.json").read_text())
    other["setup"]["sigma"] *= 2
    with pytest.raises(ValueError, match="differs .* in sigma"):
        variance.merge([json.loads((tmp_path / f"h{smoke.h_stars[1]}" / "variance.json").read_text()), other])
    other["setup"].update(sigma=smoke.sigma, dtype="bfloat16")
    with pytest.raises(ValueError, match="differs .* in dtype"):
        variance.merge([variance.load_result(parts[0]), other])
    other["setup"]["dtype"] = "float32"
    # CUDA draws other ES noise than the CPU: such runs do not merge; a file from before --device was on the CPU
    other["setup"].update(sigma=smoke.sigma, device="cuda")
    with pytest.raises(ValueError, match="differs .* in device"):
        variance.merge([variance.load_result(parts[0]), other])
    del other["setup"]["device"]
    (tmp_path / "legacy.json").write_text(json.dumps(other))
    assert variance.load_result(str(tmp_path / "legacy.json"))["setup"]["device"] == "cpu"


@pytest.mark.slow
def test_variance_es_batched_evaluator_gives_the_local_estimates_when_greedy():
    """All members in one batched rollout (per-row weight copies) against members one by one in place: greedy
    episodes are the same, so the ES estimates and every statistic of them are equal; other setups refuse."""
    rows = {}
    for kind in ("local", "batched"):
        setup = variance.Setup(**{**variance.SMOKE, "h_stars": [1], "temperature": 0.0, "es_evaluator": kind})
        rows[kind] = variance.measure(setup, progress=False)["rows"]
    assert rows["local"] == rows["batched"]
    assert next(r for r in rows["local"] if r["method"] == "es")["trace_per_dim"] > 0
    with pytest.raises(ValueError, match="--es-evaluator must be local or batched"):
        variance.Setup(es_evaluator="ray").check()


def test_step_probe_smoke_compares_the_es_step_with_a_same_length_random_control(tmp_path):
    from esopt.experiments import step_probe

    assert step_probe.main(["--smoke", "--quiet", "--pairs", "3", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "step_probe.json").read_text())
    rows = {(r["variant"], r["group"]): r for r in result["rows"]}
    assert set(rows) == {("es", "all"), ("permuted", "all"), ("es", "norm")}
    assert result["members"] == 6 and len(result["rewards"]) == 6 and result["eval_episodes"] == 4
    es_norm, perm_norm = rows["es", "all"]["step_norm"], rows["permuted", "all"]["step_norm"]
    assert es_norm > 0 and abs(es_norm - perm_norm) / es_norm < 0.05  # same coefficients, other seeds
    assert 0 < rows["es", "norm"]["step_norm"] < es_norm  # the norm weights are a sliver of the model
    for r in result["rows"]:
        low, mean, high = r["d_success"][1], r["d_success"][0], r["d_success"][2]
        assert low <= mean <= high
    assert "| permuted | all |" in (tmp_path / "step_probe.md").read_text()
    with pytest.raises(ValueError, match="regex"):
        step_probe.main(["--smoke", "--quiet", "--groups", "(", "--out", str(tmp_path)])


def test_gpu_benchmark_runs_on_cpu_at_a_tiny_shape(capsys):
    from esopt.experiments import gpu

    assert gpu.main(["--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "--members", "2", "--batch", "2",
                     "--prompt-tokens", "4", "--new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    for mode in ("inference", "full-rank", "full-rank batched", "low-rank in place", "low-rank batched"):
        assert f"| {mode} |" in out
    assert gpu.main(["--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "--members", "2", "--batch", "2",
                     "--prompt-tokens", "4", "--new-tokens", "3", "--modes", "full-rank batched"]) == 0
    out = capsys.readouterr().out
    assert "| full-rank batched |" in out and "| full-rank |" not in out and "| low-rank batched |" not in out


@pytest.mark.slow
def test_population_benchmark_compares_backends_side_by_side(capsys):
    from esopt.experiments import population

    assert population.main(["--model", "tiny", "--members", "4", "--tasks", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| low-rank batched |" in out and "| full-rank sequential |" in out and "1.00x" in out


def test_variance_setup_on_the_pretrained_model():
    parse = variance.build_parser().parse_args
    setup = variance.setup_from_args(parse(["--model", "smollm2", "--env-arg", "hints=candidates", "--env-arg",
                                            "examples=episode", "--few-shot", "2", "--temperature", "0.3"]))
    assert (setup.model, setup.few_shot, setup.temperature) == ("smollm2", 2, 0.3)
    assert setup.env_kwargs == {"hints": "candidates", "examples": "episode"} and setup.micro_batch == 16
    assert variance.setup_from_args(parse([])).env_kwargs == {}  # no state shared between setups
    assert variance.setup_from_args(parse([])).device == "cpu"
    assert variance.setup_from_args(parse(["--device", "cuda:1"])).device == "cuda:1"
    for bad, match in ((["--env-arg", "hints"], "KEY=VALUE"), (["--env-arg", "h_star=3"], "set by the analysis"),
                       (["--device", "gpu"], "--device 'gpu': must be cpu")):
        with pytest.raises(ValueError, match=match):
            variance.setup_from_args(parse(bad))


def test_step_flops_count_every_pass_each_method_runs():
    plan = horizon.plan_from_args(horizon.build_parser().parse_args(["--preset", "smoke", "--set", "ppo.epochs=3"]))
    config = {m: horizon.run_config(plan, m, 2, 0) for m in horizon.METHODS}
    row = {"prompt_tokens": 900, "generated_tokens": 100, "samples": 10}
    per_token = {m: horizon.step_flops(config[m], row, 1.0) / 1000 for m in horizon.METHODS}
    # ES: the rollout's forward. GRPO (1 epoch, one minibatch): + fwd+bwd (6) + KL reference (2), no old pass.
    # PPO: + 3 epochs x 6 + old log-probs (2) + reference (2), and its critic on the 900 prompt tokens: 2 + 3 x 6
    assert per_token == {"es": 2.0, "grpo": 2.0 + 6.0 + 2.0,
                         "ppo": 2.0 + 18.0 + 2.0 + 2.0 + (2.0 + 18.0) * 0.9}
    more = {**row, "samples": config["grpo"].grpo.minibatch_size + 1}  # two minibatches: old log-probs are needed
    assert horizon.step_flops(config["grpo"], more, 1.0) / 1000 == 2.0 + 6.0 + 2.0 + 2.0
    assert math.isnan(horizon.step_flops(config["es"], {"generated_tokens": 5}, 1.0))  # an old row: no estimate


def test_smollm2_preset_carries_the_calibrated_setting_to_every_method():
    parse = horizon.build_parser().parse_args
    plan = horizon.plan_from_args(parse(["--preset", "smollm2", "--h-stars", "2", "--set", "env.few_shot=1"]))
    configs = {m: horizon.run_config(plan, m, 2, 0) for m in horizon.METHODS}
    for config in configs.values():
        kwargs = config.env.kwargs
        assert (kwargs["hints"], kwargs["examples"], kwargs["h_star"]) == ("candidates", "episode", 2)
        assert config.env.few_shot == 1  # the command line's override comes after the preset's
        assert (config.sampling.temperature, config.sampling.top_p, config.sampling.top_k) == (0.3, 1.0, 0)
        assert config.model.name == "smollm2" and config.episodes_per_step == 32
        # fp32 whatever the CPU (a table must not change with the CPU type), evals in calls of <= 128 rows
        assert config.model.resolved_dtype == "float32" and config.max_batch_size == 128
    assert horizon.PRESETS["smollm2"]["overrides"][-1] == "max_batch_size=128"  # the preset itself is not mutated
    assert horizon.plan_from_args(parse(["--preset", "smoke", "--temperature", "0.2"])).temperature == 0.2


def test_horizon_report_states_the_hyper_parameters_the_runs_were_given():
    plan = horizon.Plan(**horizon.PRESETS["smoke"])
    plan.overrides = ["grpo.lr=3e-5", "es.sigma=4e-3", "sampling.top_p=1.0"]
    head = horizon.report(plan, []).split("\n\n")[1]
    used = json.loads(head.split("Hyper-parameters as run: ")[1].split("; overrides")[0])
    assert used["grpo"]["lr"] == 3e-5 and used["es"]["sigma"] == 4e-3
    assert used["ppo"]["lr"] == horizon.HPARAMS["ppo"]["lr"]  # not overridden: the default
    assert "top-p 1.0" in head and "(float32)" in head
