"""The sweep runner: a fresh process per run (progress only when asked), several at once (--jobs), stopping cleanly."""

import json
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
import pathlib, signal, sys, time
run = pathlib.Path(sys.argv[1])

def interrupted(*_):
    (run / "interrupted").write_text("SIGINT")
    sys.exit(130)

signal.signal(signal.SIGINT, interrupted)
print("child of", run.name, flush=True)
(run / "start").write_text(repr(time.time()))
deadline = time.time() + 10
while len(list(run.parent.glob("*/start"))) < 2 and time.time() < deadline:  # until a sibling runs too
    time.sleep(0.01)
if run.name == "quit":
    sys.exit(130)
time.sleep(30 if run.name == "slow" else 0.05)
(run / "end").write_text(repr(time.time()))
if run.name != "bad":
    (run / "summary.json").write_text("{}")
sys.exit(1 if run.name == "bad" else 0)
"""


def _fake_children(tmp_path, monkeypatch):
    import sys

    script = tmp_path / "child.py"
    script.write_text(FAKE_CHILD)
    monkeypatch.setattr(sweep, "child_command", lambda run, resume, progress: [sys.executable, str(script), str(run)])


def test_parallel_runs_keep_jobs_going_each_with_its_log_and_a_failure_stays_local(tmp_path, monkeypatch, capsys):
    import pytest

    _fake_children(tmp_path, monkeypatch)
    monkeypatch.setattr(sweep, "STATUS_EVERY", 0.0)  # a status line at every poll
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
    assert "0/5 runs ended | running: a step 0, b step 0" in out
    rows = [{"kind": "eval"}, {"kind": "train"}, {"kind": "train"}]
    (tmp_path / "runs" / "a" / "metrics.jsonl").write_text("".join(f"{json.dumps(r)}\n" for r in rows) + '{"ki')
    assert sweep.steps_done(tmp_path / "runs" / "a") == 2 and sweep.steps_done(tmp_path / "none") == 0
    assert f"its log: {tmp_path / 'runs' / 'bad' / 'train.log'}" in err
    with pytest.raises(ValueError, match="only with isolated runs"):
        sweep.run_sweep({"a": config}, tmp_path / "other", jobs=2)


def test_a_run_interrupted_on_its_own_stops_the_sweep_and_its_siblings_save(tmp_path, monkeypatch, capsys):
    """A run that exits 130 (its own Ctrl-C) stops the sweep: the running sibling gets SIGINT (to save its
    checkpoint and exit) and is waited for, and no further run starts."""
    import pytest

    _fake_children(tmp_path, monkeypatch)
    config = load_config("smoke", ["model.name=tiny"])
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep({n: config for n in ("quit", "slow", "later")}, tmp_path / "runs", isolate=True, jobs=2)
    runs = tmp_path / "runs"
    assert (runs / "slow" / "interrupted").read_text() == "SIGINT" and not (runs / "slow" / "end").exists()
    assert not (runs / "later" / "start").exists()  # never started
    assert "waiting for slow to save and exit" in capsys.readouterr().err
