"""The ES trainer end to end on the tiny model: artefacts, replay, kill-and-resume, checkpoints, configs."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from esopt.es import read_history, replay
from esopt.train.config import ConfigError, build_config, load_config
from esopt.train.es import train
from esopt.train.models import load_model
from esopt.train.rundir import RunDir
from tests.pause import kill_when_parked
from tests.tolerance import assert_close_up_to_rounding, network_rtol

TINY = [
    "steps=2",
    "model.name=tiny-sudoku",
    "model.warm_start_steps=60",
    "env.kwargs.size=4",
    "env.kwargs.h_star=3",
    "sampling.max_new_tokens=10",
    "eval.tasks=4",
    "eval.every=1",
    "checkpoint_every=1",
    "es.population_size=4",
    "es.antithetic=true",
    "es.tasks_per_member=6",
    "es.sigma=0.05",
    "es.sigma_min=0.005",
    "es.alpha=0.01",
    "es.reward=shaped",
    "measure_inference_peak=false",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def weights(run_dir: Path, sub: str = "final") -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / sub / "model.safetensors"))


@pytest.mark.slow
def test_two_generation_run_writes_every_artefact_and_replays_bit_exact(tmp_path):
    out = tmp_path / "run"
    # device=auto (the paper configs' setting) resolves to the policy's device everywhere, memory included
    summary = train(build_config({}, [*TINY, "model.device=auto"]), out, progress=False)
    for name in ["config.yaml", "history.jsonl", "metrics.jsonl", "summary.json", "final/model.safetensors",
                 "final/tokenizer.json", "final/config.json", "plots/eval.png", "plots/reward_spread.png"]:
        assert (out / name).exists(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert list((out / "checkpoints").glob("step_*/model.safetensors"))
    assert len(read_history(out / "history.jsonl")) == 2
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 1, 2]
    first_eval = next(r for r in rows if r["kind"] == "eval")
    assert len(first_eval["episode_success"]) == len(first_eval["episode_shaped"]) == 4  # tasks x repeats
    assert first_eval["success_rate"] == sum(first_eval["episode_success"]) / 4
    assert summary["steps_done"] == 2 and 0 <= summary["time_split"]["es_overhead_share"] <= 1
    assert load_config(out / "config.yaml").es.population_size == 4

    # replay from the base model and the ledger gives the trained fp32 weights bit for bit
    config = load_config(out / "config.yaml")
    base = load_model(config.model, config.env.kwargs)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    replay(base.model, out / "history.jsonl")
    trained = weights(out)
    changed = 0
    for k, v in trained.items():
        assert torch.equal(base.model.state_dict()[k], v), k
        changed += not torch.equal(before[k], v)
    assert changed > 0

    # the CLI replays too, and a fresh process loads the checkpoint with plain transformers
    rebuilt = tmp_path / "rebuilt"
    subprocess.run([sys.executable, "-m", "esopt.cli", "replay", str(out), "--out", str(rebuilt)], check=True,
                   env=ENV, capture_output=True)
    for k, v in weights(rebuilt, ".").items():
        assert torch.equal(trained[k], v), k
    ids = [[5, 17, 30, 41, 12, 3]]
    code = ("import sys, json, torch; from transformers import AutoModelForCausalLM as M; "
            "m = M.from_pretrained(sys.argv[1]); "
            f"print(json.dumps(m(torch.tensor({ids})).logits[0].tolist()))")
    res = subprocess.run([sys.executable, "-c", code, str(out / "final")], check=True, env=ENV,
                         capture_output=True, text=True)
    fresh = torch.tensor(json.loads(res.stdout.strip().splitlines()[-1]))
    with torch.no_grad():
        here = base.model(torch.tensor(ids)).logits[0]
    assert_close_up_to_rounding(fresh, here, network_rtol(base.model))  # another process: other threads, blocking


def _cli_train(*args, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "esopt.cli", "train", *args, "--no-progress"], env=env or ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def _parked_at(point: str, pause_dir: Path, *args) -> subprocess.Popen:
    """Start `esopt train ARGS` so that it waits at the named pause point (`esopt.utils.faults`)."""
    pause_dir.mkdir()
    return _cli_train(*args, env={**ENV, "ESOPT_PAUSE_AT": point, "ESOPT_PAUSE_DIR": str(pause_dir)})


def _kill_at(point: str, pause_dir: Path, *args) -> dict:
    return kill_when_parked(_parked_at(point, pause_dir, *args), point, pause_dir)


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    """Killed (SIGKILL) at three named points of one 4-generation run, resumed after each: the weights and the
    ledger equal an uninterrupted run's bit for bit. The points: mid-rollout with the weights perturbed
    (generation 2), just after a ledger line is written but before its metrics row and checkpoint (generation
    2), and with the last checkpoint's files written but not yet renamed into place (generation 4)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("algo: es\n")
    overrides = [o for o in TINY if not o.startswith(("steps=", "checkpoint_every="))] + [
        "steps=4", "checkpoint_every=2", "eval.every=0"]
    run = tmp_path / "killed"
    lines = lambda: len(read_history(run / "history.jsonl"))  # noqa: E731

    # 1. the 7th member rollout of the process: generation 2's third member, its noise in the weights (the
    # uninterrupted reference runs here meanwhile; the other process waits at the point until it is killed)
    first = _parked_at("rollout@7", tmp_path / "p1", str(cfg), "--out", str(run), *overrides)
    train(build_config({"algo": "es"}, overrides), tmp_path / "ref", progress=False)
    info = kill_when_parked(first, "rollout@7", tmp_path / "p1")
    assert info["member"] == 2 and lines() == 1 and not (run / "checkpoints").exists()
    # 2. resumed at generation 2: killed right after its ledger line, before its metrics row and the checkpoint
    _kill_at("ledger@1", tmp_path / "p2", "--resume", str(run))
    assert lines() == 2 and not (run / "checkpoints" / "step_000002").exists()
    assert [r["step"] for r in RunDir(run, create=False).metrics() if r["kind"] == "train"] == [1]
    # 3. resumed at generation 3 (generation 2 replayed from the ledger): killed inside the step-4 checkpoint
    info = _kill_at("save@1", tmp_path / "p3", "--resume", str(run))
    assert info["path"] == str(run / "checkpoints" / "step_000004") and lines() == 4
    assert not (run / "checkpoints" / "step_000004").exists() and not (run / "final").exists()

    summary = train(load_config(run / "config.yaml"), run, resume=True, progress=False)
    assert summary["steps_done"] == 4 and not summary["interrupted"]
    a, b = weights(tmp_path / "ref"), weights(run)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert read_history(run / "history.jsonl") == read_history(tmp_path / "ref" / "history.jsonl")
    assert any(any(w != 0 for w in r["weights"]) for r in read_history(run / "history.jsonl"))  # real updates


SMALL_FILES = {"config.yaml", "history.jsonl", "metrics.jsonl", "summary.json"}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_run_whose_weights_are_gone_resumes_from_its_ledger_to_the_same_weights(tmp_path, optimizer, capsys):
    """A long run outlives a session as its small files (config, ledger, metrics: kilobytes); on a fresh machine
    the weights are rebuilt from the base model and history.jsonl. Stopped after 2 of 4 generations, every weight
    file deleted, resumed: the same final weights, bit for bit, as an unbroken run (fp32). Adam's moments are in
    no file at all: they are rebuilt from the ledger too."""
    import shutil

    over = ["es.total_generations=4", "eval.every=0", "eval.tasks=4", "checkpoint_every=1",
            "measure_inference_peak=false", f"es.optimizer={optimizer}"]  # smoke: members score differently
    whole, part = tmp_path / "whole", tmp_path / "part"
    train(load_config("smoke", [*over, "steps=4"]), whole, progress=False)
    train(load_config("smoke", [*over, "steps=2"]), part, progress=False)
    for name in os.listdir(part):
        if name not in SMALL_FILES:
            shutil.rmtree(part / name) if (part / name).is_dir() else (part / name).unlink()
    assert set(os.listdir(part)) == SMALL_FILES
    capsys.readouterr()
    summary = train(load_config(part / "config.yaml", ["steps=4"]), part, resume=True, progress=True)
    assert "rebuilding the weights of generation 2 from the base model and the ledger" in capsys.readouterr().out
    assert summary["steps_done"] == 4 and len(read_history(part / "history.jsonl")) == 4
    a, b = weights(part), weights(whole)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first, last = (read_history(whole / "history.jsonl")[i]["weights"] for i in (0, 3))
    assert any(first) and any(last)  # real updates, so the check has something to compare



@pytest.mark.parametrize(
    "text, message",
    [
        ("es:\n  sigma: -1\n", "config error: es.sigma: Input should be greater than 0"),
        ("es:\n  popsize: 4\n", "config error: es.popsize: Extra inputs are not permitted"),
        ("algo: dqn\n", "config error: algo: unknown algorithm 'dqn'"),
        ("es: [1, 2\n", "is not valid YAML"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("es:\n  sigma: 1e-3\n  sigma_min: 1e-2\n", "sigma_min (0.01) must not exceed sigma"),
    ],
)
def test_malformed_configs_give_one_line_errors(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    if "sigma: -1" not in text:
        return  # the CLI path is the same for every case: check it once (a subprocess costs seconds)
    res = subprocess.run([sys.executable, "-m", "esopt.cli", "train", str(path)], env=ENV, capture_output=True,
                         text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and message in res.stderr


def test_overrides_merge_into_nested_defaults():
    c = build_config({"env": {"kwargs": {"size": 6}}}, ["env.kwargs.h_star=7", "es.sigma=2e-3"])
    assert c.env.kwargs == {"size": 6, "h_star": 7} and c.es.sigma == 2e-3
    with pytest.raises(ConfigError, match="must look like key=value"):
        build_config({}, ["es.sigma"])


def test_a_run_dir_records_the_dtype_auto_resolved_to(tmp_path, monkeypatch):
    """SmolLM2's "auto" is bf16 on a CPU with native bf16 and fp32 on others: a resume or replay on another CPU
    type reads the dtype the run computed in, not "auto" again."""
    import esopt.models

    config = build_config({"model": {"name": "smollm2"}}, [])
    assert config.model.dtype == "auto"
    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(esopt.models, "cpu_has_native_bf16", lambda native=native: native)
        run = RunDir(tmp_path / dtype)
        run.write_config(config)
        monkeypatch.setattr(esopt.models, "cpu_has_native_bf16", lambda native=native: not native)  # elsewhere
        assert load_config(run.config_path).model.resolved_dtype == dtype
        assert load_config(run.config_path).model_dump(exclude={"model"}) == config.model_dump(exclude={"model"})


def test_shipped_configs_validate():
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml")):
        load_config(path)


@pytest.mark.slow
def test_quick_demo_prints_the_before_after_table(tmp_path):
    """Through the CLI, which restarts itself with glibc's mmap threshold fixed so the printed peak ratio is of
    live memory; the ratio is measured (a fresh inference-only process), not n/a."""
    env = {k: v for k, v in ENV.items() if not k.startswith("MALLOC_")}
    res = subprocess.run([sys.executable, "-m", "esopt.cli", "demo", "--quick", "--tiny", "--out",
                          str(tmp_path / "demo")], env=env, capture_output=True, text=True, check=True)
    out = res.stdout
    assert "success rate" in out and "ES fine-tuned" in out and "set-up (warm start" in out
    assert re.search(r"ES / inference-only \(same model, batch, fixed malloc threshold\) = \d+\.\d{3}\n", out)
    assert (tmp_path / "demo" / "final" / "model.safetensors").exists()
    assert (tmp_path / "demo" / "plots" / "eval.png").exists()


def test_train_loop_climbs_a_reward_that_is_linear_in_the_weights(tmp_path, monkeypatch):
    """Member i's reward must reach the update as member i's: with reward = <theta, u> (noise-free), every
    generation's z-scored update moves theta along u (sum_i z_i <eps_i, u> > 0); antithetic pairs make the
    population's mean reward exactly <theta, u>, so it must rise every generation. A reward/member mix-up,
    a sign error or an update along the wrong seeds makes <theta, u> drift at random instead."""
    from esopt.rollout import RolloutSpec, RolloutStats, Trajectory

    probe: dict = {}

    def linear_reward_rollout(self, policy, make, task_seeds, seed, **kwargs):
        if "u" not in probe:
            probe["param"] = policy.model.model.layers[0].mlp.up_proj.weight
            probe["u"] = torch.randn(probe["param"].shape, generator=torch.Generator().manual_seed(5))
        value = float((probe["param"].detach() * probe["u"]).sum())  # the weights as perturbed right now
        return [Trajectory(task_seed=s, reward=value) for s in task_seeds], RolloutStats(episodes=len(task_seeds))

    monkeypatch.setattr(RolloutSpec, "run", linear_reward_rollout)
    config = build_config({}, [*TINY, "steps=4", "eval.every=0", "checkpoint_every=10", "es.reward=env",
                               "es.antithetic=true"])
    out = tmp_path / "run"
    train(config, out, progress=False)
    values = [r["reward_mean"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "train"]
    assert len(values) == 4 and all(b > a for a, b in zip(values, values[1:])), values


def test_a_population_with_equal_rewards_is_said_in_the_generation_line_not_warned(tmp_path, monkeypatch, capsys):
    """Sparse rewards often tie a whole population: the trainer says "zero update" on its line (as the
    ledger's zero weights do) instead of a Python warning with a source path in the middle of the log."""
    import warnings

    from esopt.rollout import RolloutSpec, RolloutStats, Trajectory

    def equal_rewards(self, policy, make, task_seeds, seed, **kwargs):
        return [Trajectory(task_seed=s, reward=0.0) for s in task_seeds], RolloutStats(episodes=len(task_seeds))

    monkeypatch.setattr(RolloutSpec, "run", equal_rewards)
    config = build_config({}, [*TINY, "steps=1", "eval.every=0", "checkpoint_every=10", "es.reward=env"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(config, tmp_path / "run", progress=True)
    assert not [w for w in caught if "rewards are equal" in str(w.message)]
    assert "zero update: all rewards equal" in capsys.readouterr().out
    assert all(w == 0 for w in read_history(tmp_path / "run" / "history.jsonl")[0]["weights"])


def test_shipped_smoke_config_makes_real_updates(tmp_path):
    """`esopt train smoke` (found by name, as in a non-editable install): every generation's members score
    differently, so every update is non-zero (a replay or resume test on it checks something)."""
    out = tmp_path / "smoke"
    summary = train(load_config("smoke", ["steps=2", "eval.tasks=4", "measure_inference_peak=false"]), out,
                    progress=False)
    assert summary["steps_done"] == 2
    for record in read_history(out / "history.jsonl"):
        assert len(set(record["rewards"])) > 1 and any(w != 0 for w in record["weights"])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["update_rms"] > 0 for r in rows if r["kind"] == "train")
    # resuming a finished run changes nothing: same summary, same ledger
    before = (out / "summary.json").read_bytes(), (out / "history.jsonl").read_bytes()
    again = train(load_config(out / "config.yaml"), out, resume=True, progress=False)
    assert again == summary or again["seconds"] == summary["seconds"]
    assert ((out / "summary.json").read_bytes(), (out / "history.jsonl").read_bytes()) == before


def test_ctrl_c_checkpoints_and_says_there_was_no_final_eval(tmp_path, monkeypatch, capsys):
    import esopt.population.local as local

    real, calls = local.run_member, {"n": 0}

    def member_then_ctrl_c(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 4:  # 4 members of generation 1 finish, then Ctrl-C in generation 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(local, "run_member", member_then_ctrl_c)
    out = tmp_path / "run"
    summary = train(load_config("smoke", ["steps=3", "eval.tasks=2", "eval.every=0"]), out, progress=False)
    text = capsys.readouterr().out
    assert summary["interrupted"] and summary["steps_done"] == 1
    assert "interrupted at generation 1/3: no final eval" in text and "done:" not in text
    assert (out / "checkpoints" / "step_000001" / "model.safetensors").exists()
    assert not (out / "final").exists()


@pytest.mark.slow
def test_logs_without_a_terminal_hold_plain_lines(tmp_path):
    """Progress on, stderr a pipe (`| tee`): no carriage-return bars, no library shard bars."""
    res = subprocess.run([sys.executable, "-m", "esopt.cli", "train", "smoke", "--out", str(tmp_path / "run"),
                          "steps=1", "eval.tasks=2", "measure_inference_peak=false"], env=ENV, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stdout + res.stderr
    assert "Loading weights" not in res.stderr and "Writing model shards" not in res.stderr
    assert "generation 1/1" in res.stdout
