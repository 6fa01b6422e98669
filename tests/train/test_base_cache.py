"""`eval.base_cache`: runs that start from the same model on the same held-out setting share one base eval."""

import json
import multiprocessing
import time

import pytest

import esopt.train.loop as loop
from esopt.train.config import load_config
from esopt.train.es import train
from esopt.train.evaluate import base_eval_key, cached_base_eval


def test_runs_with_one_base_share_its_eval_and_others_do_not(tmp_path, monkeypatch):
    calls = []

    def counted(*args, _orig=loop.evaluate, **kwargs):
        calls.append(args[1].algo)
        return _orig(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", counted)
    common = ["steps=1", "eval.tasks=3", "eval.every=0", "measure_inference_peak=false", "es.population_size=2",
              "es.tasks_per_member=2",
              f"eval.base_cache={tmp_path / 'cache'}"]
    first = train(load_config("smoke", common), tmp_path / "a", progress=False)
    assert len(calls) == 2  # base and final
    # another seed and ES setting, same model / env / sampling / held-out set: the base eval is reused
    second = train(load_config("smoke", [*common, "seed=5", "es.sigma=0.05"]), tmp_path / "b", progress=False)
    assert len(calls) == 3 and second["eval_before"] == first["eval_before"]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    logged = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["kind"] == "eval" and logged[0]["success_rate"] == first["eval_before"]["success_rate"]


def test_learning_curve_evals_run_on_validation_tasks_on_schedule_and_resume_without_repeats(tmp_path, monkeypatch):
    """eval.curve_every=2 over 4 steps: validation evals at steps 0, 2 and 4 (curve_tasks tasks of the validation
    split, none of the held-out test tasks); the step-0 one comes from the base cache in a second run; a resumed
    run adds only the missing curve points."""
    from esopt.train.tasks import heldout_task_seeds

    seen = []

    def counted(policy, config, *args, _orig=loop.evaluate, **kwargs):
        seen.append((config.eval.split, tuple(heldout_task_seeds(config))))
        return _orig(policy, config, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", counted)
    common = ["steps=4", "eval.tasks=3", "eval.every=0", "eval.curve_every=2", "eval.curve_tasks=2",
              "measure_inference_peak=false", "es.population_size=2", "es.tasks_per_member=2", "checkpoint_every=1",
              f"eval.base_cache={tmp_path / 'cache'}"]
    config = load_config("smoke", common)
    train(config, tmp_path / "a", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "curve"] == [0, 2, 4]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 4]
    curve_seeds = {s for split, s in seen if split == "validation"}
    test_seeds = {s for split, s in seen if split == "test"}
    assert len(curve_seeds) == 1 and len(next(iter(curve_seeds))) == 2 and not set(*curve_seeds) & set(*test_seeds)
    assert sum(split == "validation" for split, _ in seen) == 3
    seen.clear()
    train(load_config("smoke", [*common, "seed=3"]), tmp_path / "b", progress=False)
    assert sum(split == "validation" for split, _ in seen) == 2  # the step-0 point came from the cache
    # cut the run back to after step 2 (ES resumes from its ledger), then resume: only step 4's point is added
    history = tmp_path / "a" / "history.jsonl"
    history.write_text("".join(history.read_text().splitlines(keepends=True)[:2]))
    (tmp_path / "a" / "summary.json").unlink()
    seen.clear()
    train(config, tmp_path / "a", resume=True, progress=False)
    resumed = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed if r["kind"] == "curve"] == [0, 2, 4]
    assert sum(split == "validation" for split, _ in seen) == 1
    assert [r["step"] for r in resumed if r["kind"] == "train"] == [1, 2, 3, 4]


def test_the_key_ignores_what_cannot_change_the_base_eval():
    base = load_config("smoke", [])
    same = [["seed=7"], ["steps=9"], ["es.alpha=0.5"], ["eval.every=3"], ["eval.base_cache=/tmp/x"],
            ["eval.curve_every=2"], ["eval.curve_tasks=5"]]
    other = [["eval.tasks=5"], ["eval.split=validation"], ["sampling.temperature=0.1"], ["model.seed=3"],
             ["env.few_shot=1"], ["max_batch_size=2"]]
    assert all(base_eval_key(load_config("smoke", o)) == base_eval_key(base) for o in same)
    assert all(base_eval_key(load_config("smoke", o)) != base_eval_key(base) for o in other)


def _eval_in_child(cache: str, log: str, out: str) -> None:

    def compute():
        with open(log, "a") as f:
            f.write("computed\n")
        time.sleep(2)  # long enough that the other process arrives while this one computes
        return {"success_rate": 0.25}

    result = cached_base_eval(load_config("smoke", [f"eval.base_cache={cache}"]), compute)
    with open(out, "w") as f:
        json.dump(result, f)


def test_runs_started_side_by_side_compute_the_base_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    log = tmp_path / "computed.log"
    procs = [ctx.Process(target=_eval_in_child, args=(str(tmp_path / "cache"), str(log), str(tmp_path / f"{i}.json")))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert log.read_text().count("computed") == 1
    assert all(json.loads((tmp_path / f"{i}.json").read_text()) == {"success_rate": 0.25} for i in range(2))


@pytest.mark.parametrize("max_batch, probed", [(None, 5), (3, 3)])
def test_the_inference_memory_probe_rolls_out_no_more_rows_than_one_generate_call_holds(
        tmp_path, monkeypatch, max_batch, probed):
    asked = []
    monkeypatch.setattr(loop, "inference_peak_bytes", lambda config, episodes: asked.append(episodes) or 1)
    overrides = ["steps=1", "eval.tasks=5", "eval.every=0", "measure_inference_peak=true", "es.population_size=2",
                 "es.tasks_per_member=2", f"max_batch_size={'null' if max_batch is None else max_batch}"]
    summary = train(load_config("smoke", overrides), tmp_path / "run", progress=False)
    assert asked == [probed] and summary["inference_peak_bytes"] == 1


def test_a_run_killed_in_its_final_eval_resumes_at_the_eval_not_steps_back(tmp_path, monkeypatch):
    """GRPO (weights and optimizer from the checkpoint) over 2 steps with checkpoint_every=5: the last step is
    saved before its evals, and its validation point logged before the held-out one; a run that dies in the
    final held-out eval resumes with no training step, only that eval."""
    from esopt.train.pg.grpo import train as train_grpo

    evals = []

    def dies_in_the_final_test_eval(policy, config, *args, _orig=loop.evaluate, **kwargs):
        evals.append(config.eval.split)
        if config.eval.split == "test" and evals.count("test") == 2:
            raise RuntimeError("killed")
        return _orig(policy, config, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", dies_in_the_final_test_eval)
    config = load_config("grpo_smoke", ["steps=2", "eval.tasks=3", "eval.every=0", "eval.curve_every=2",
                                        "eval.curve_tasks=2", "measure_inference_peak=false", "checkpoint_every=5"])
    with pytest.raises(RuntimeError, match="killed"):
        train_grpo(config, tmp_path / "a", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows if r["kind"] != "train"] == [("eval", 0), ("curve", 0), ("curve", 2)]
    summary = train_grpo(config, tmp_path / "a", resume=True, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 2] and summary["steps_done"] == 2
    assert evals[-1] == "test" and evals.count("validation") == 2  # nothing but the final eval was redone


def test_a_run_resumed_between_evals_runs_no_held_out_eval_there(tmp_path, monkeypatch):
    """Resumed from a checkpoint at step 2 of 4 with eval.every=0: no held-out eval at step 2 (at H*=8 on the
    CPU one costs an hour); the base and the final are the only ones, as in a run never stopped."""
    from esopt.train.pg.grpo import train as train_grpo

    config = load_config("grpo_smoke", ["steps=4", "eval.tasks=2", "eval.every=0", "measure_inference_peak=false",
                                        "checkpoint_every=2"])
    splits = []

    def counted(policy, which, *args, _orig=loop.evaluate, **kwargs):
        splits.append(which.eval.split)
        return _orig(policy, which, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", counted)
    stop = {"at": 2}
    orig_log = loop.RunDir.log

    def log(self, step, kind, row, _orig=orig_log):
        _orig(self, step, kind, row)
        if kind == "train" and step == stop["at"]:
            raise KeyboardInterrupt  # a Ctrl-C right after step 2: saved at step 2

    monkeypatch.setattr(loop.RunDir, "log", log)
    train_grpo(config, tmp_path / "a", progress=False)
    stop["at"] = None
    summary = train_grpo(config, tmp_path / "a", resume=True, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4] and summary["steps_done"] == 4
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 4]
    assert splits == ["test", "test"]
    # its time per step and peak cover both processes' steps, not only the resumed one's
    trained = sum(r["seconds"] for r in rows if r["kind"] == "train")
    evals_after = sum(r["eval_seconds"] for r in rows if r["kind"] in ("eval", "curve") and r["step"] > 0)
    assert summary["seconds_per_step"] == pytest.approx((trained + evals_after) / 4)
    assert summary["peak_memory_bytes"] >= max(r["peak_memory_bytes"] for r in rows if r["kind"] == "train")
