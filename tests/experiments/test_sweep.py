"""The sweep runner's isolated child: a fresh process per run, which reports progress only when asked."""

import subprocess

from esopt.experiments import sweep
from esopt.train.config import dump_config, load_config


def test_an_isolated_run_reports_progress_in_its_log_only_when_asked(tmp_path, monkeypatch, capsys):
    commands = []

    class Child:  # the parent's side: which command the child gets
        def __init__(self, cmd, env):
            commands.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Child)
    assert sweep.train_in_child(tmp_path / "a", resume=False, threads=1) == 0
    assert sweep.train_in_child(tmp_path / "b", resume=True, threads=1, progress=True) == 0
    assert commands[0][-1] == str(tmp_path / "a") and commands[1][-2:] == ["--resume", "--progress"]
    monkeypatch.undo()

    # the child's side (its `main`, run here): a plain progress line in the log, none without --progress
    config = load_config("smoke", ["steps=1", "eval.tasks=1", "eval.every=0", "model.name=tiny"])
    for name in ("quiet", "loud"):
        (tmp_path / name).mkdir()
        dump_config(config, tmp_path / name / "config.yaml")
    assert sweep.main([str(tmp_path / "quiet")]) == 0
    silent = capsys.readouterr().err
    assert sweep.main([str(tmp_path / "loud"), "--progress"]) == 0
    told = capsys.readouterr().err
    assert sweep.run_state(tmp_path / "quiet") == sweep.run_state(tmp_path / "loud") == "done"
    line = next(x for x in told.splitlines() if "1/1 (100%)" in x)  # not a terminal: a line, not a bar
    assert "\r" not in line and "ETA" in line and "1/1 (100%)" not in silent



FAKE_CHILD = """
import pathlib, sys, time
run = pathlib.Path(sys.argv[1])
print("child of", run.name, flush=True)
(run / "start").write_text(repr(time.time()))
time.sleep(0.4)
(run / "end").write_text(repr(time.time()))
if run.name != "bad":
    (run / "summary.json").write_text("{}")
sys.exit(1 if run.name == "bad" else 0)
"""


def test_parallel_runs_keep_jobs_going_each_with_its_log_and_a_failure_stays_local(tmp_path, monkeypatch, capsys):
    import sys

    import pytest

    script = tmp_path / "child.py"
    script.write_text(FAKE_CHILD)
    monkeypatch.setattr(sweep, "child_command", lambda run, resume, progress: [sys.executable, str(script), str(run)])
    config = load_config("smoke", ["model.name=tiny"])
    names = ["a", "b", "bad", "c", "d"]
    assert sweep.run_sweep({n: config for n in names}, tmp_path / "runs", isolate=True, jobs=2) == ["bad"]
    out, err = capsys.readouterr()
    spans = []
    for name in names:
        run = tmp_path / "runs" / name
        spans.append((float((run / "start").read_text()), float((run / "end").read_text())))
        assert (run / "train.log").read_text() == f"child of {name}\n"  # its own output, in its own log
        assert (run / "bench.json").exists() == (name != "bad") and (run / "config.yaml").exists()
    running = [sum(s <= t < e for s, e in spans) for t, _ in spans]  # runs alive as each one starts
    assert max(running) == 2  # two at a time, never three
    assert "d: done (exit code 0)" in out and "bad failed (exit code 1)" in err
    assert f"its log: {tmp_path / 'runs' / 'bad' / 'train.log'}" in err
    with pytest.raises(ValueError, match="only with isolated runs"):
        sweep.run_sweep({"a": config}, tmp_path / "other", jobs=2)
