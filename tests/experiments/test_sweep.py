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
