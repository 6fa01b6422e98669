"""The sweep runner every multi-run experiment shares: train each named config into ROOT/NAME unless it is
finished, continue partial runs on `resume`, optionally each in a fresh process (honest per-run peak memory),
`jobs` of those at a time, and record each run's wall-clock in ROOT/NAME/bench.json. A failed run is reported
and left out, not fatal.

    python -m esopt.experiments.sweep RUN_DIR [--resume] [--progress]    # the child process of one isolated run
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def run_state(run: Path) -> str:
    """"done" (a summary exists), "partial" (metrics or a ledger exist) or "new"."""
    if (run / "summary.json").exists():
        return "done"
    if any((run / f).exists() for f in ("metrics.jsonl", "history.jsonl")):
        return "partial"
    return "new"


def train_in_process(run: Path, resume: bool, progress: bool) -> int:
    from esopt.train import trainer
    from esopt.train.config import load_config

    config = load_config(run / "config.yaml")
    summary = trainer(config.algo)(config, run, resume=resume, progress=progress)
    return 130 if summary.get("interrupted") else 0


class RunInterrupted(KeyboardInterrupt):
    """A run's own process was interrupted (exit code 130), not necessarily this one: its siblings get SIGINT."""


def child_command(run: Path, resume: bool, progress: bool) -> list[str]:
    return [sys.executable, "-m", "esopt.experiments.sweep", str(run), *(["--resume"] if resume else []),
            *(["--progress"] if progress else [])]


def start_child(run: Path, resume: bool, threads: int, progress: bool = False, log: Path | None = None):
    """Start one run's training in a fresh process (a Popen). Output goes to the inherited stdout/stderr, or
    appended to `log` (what parallel runs do, so their lines do not interleave)."""
    cmd = child_command(run, resume, progress)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    if log is None:
        return subprocess.Popen(cmd, env=env)
    with open(log, "a") as out:  # the child holds its own copy of the descriptor
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def train_in_child(run: Path, resume: bool, threads: int, progress: bool = False) -> int:
    """Train one run in a fresh process; with `progress` it writes progress to the inherited stderr (plain lines
    in a log file, bars on a terminal)."""
    return wait_all([start_child(run, resume, threads, progress)])[0]


def wait_all(procs: list) -> list[int]:
    """Exit codes of `procs`; on Ctrl-C wait for them all first (each child got the same SIGINT and saves its
    checkpoint), then re-raise."""
    try:
        return [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.wait()
        raise


def check_jobs(jobs: int, isolate: bool) -> None:
    if jobs < 1 or (jobs > 1 and not isolate):
        raise ValueError(f"--jobs {jobs}: must be >= 1, and above 1 only with isolated runs (add --isolate)")


def run_sweep(configs: dict, root: Path, resume: bool = False, isolate: bool = False, threads: int = 1,
              progress: bool = False, jobs: int = 1) -> list[str]:
    """Train every config ({name: validated training config}) into root/name; the names of failed runs.
    `jobs` > 1 trains that many isolated runs at once, each logging to root/name/train.log."""
    from esopt.train.config import dump_config, load_config

    check_jobs(jobs, isolate)
    states = {name: run_state(root / name) for name in configs}
    if not resume and (busy := [n for n, s in states.items() if s != "new"]):
        raise FileExistsError(f"{root / busy[0]} already holds a run: pass --resume (skips finished runs, "
                              "continues partial ones) or another --out")
    todo, t0 = [], time.perf_counter()
    for k, (name, config) in enumerate(configs.items()):
        run = root / name
        if states[name] == "done":
            print(f"[{k + 1}/{len(configs)}] {name}: finished, skipped", flush=True)
            continue
        cont = states[name] == "partial"
        config = config.with_resolved_dtype()  # as the run dir records it
        if cont and load_config(run / "config.yaml").model_dump() != config.model_dump():
            print(f"warning: {name}: continuing with its stored config.yaml, which differs from this plan",
                  file=sys.stderr)
        elif not cont:
            run.mkdir(parents=True, exist_ok=True)
            dump_config(config, run / "config.yaml")
        todo.append((f"[{k + 1}/{len(configs)}] {name}: {'continuing' if cont else 'training'} "
                     f"({config.episodes_per_step} episodes/step, {config.steps} steps)", name, run, cont))
    failed: list[str] = []

    def finish(name: str, run: Path, rc: int, seconds: float) -> None:
        if rc == 130:
            raise RunInterrupted(name)
        if rc or not (run / "summary.json").exists():
            failed.append(name)
            where = f"; its log: {run / 'train.log'}" if jobs > 1 else ""
            print(f"error: {name} failed (exit code {rc}); the report leaves it out{where}", file=sys.stderr)
            return
        (run / "bench.json").write_text(json.dumps({"wall_seconds": seconds, "isolated": isolate}))

    if jobs == 1:
        for line, name, run, cont in todo:
            print(f"{line} | {time.perf_counter() - t0:.0f}s elapsed", flush=True)
            t = time.perf_counter()
            rc = train_in_child(run, cont, threads, progress) if isolate else train_in_process(run, cont, progress)
            finish(name, run, rc, time.perf_counter() - t)
        return failed
    run_parallel(todo, jobs, threads, progress, finish, t0)
    return failed


def steps_done(run: Path) -> int:
    """Training steps a run has logged so far (its metrics.jsonl's train lines)."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    done = 0
    for line in lines:
        try:
            done += json.loads(line).get("kind") == "train"
        except (json.JSONDecodeError, AttributeError):  # a line being written, or not a row
            pass
    return done


STATUS_EVERY = 60.0  # seconds between parallel runs' status lines


def run_parallel(todo: list[tuple], jobs: int, threads: int, progress: bool, finish, t0: float) -> None:
    """Keep `jobs` isolated runs going until `todo` ((start line, name, run dir, resume) each) is done; each
    logs to its run dir's train.log; `finish(name, run, exit code, seconds)` as each ends. If anything stops the
    sweep (Ctrl-C, a run interrupted, an error), no new run starts, the running ones are interrupted as Ctrl-C
    would (each saves its checkpoint; a terminal's Ctrl-C has already reached them) and waited for. Every
    STATUS_EVERY seconds a line says how far each running run is."""
    pending, running = list(todo), {}  # running: Popen -> (name, run, start time)
    total, told = len(todo), time.perf_counter()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                line, name, run, cont = pending.pop(0)
                print(f"{line}, log {run / 'train.log'} | {time.perf_counter() - t0:.0f}s elapsed", flush=True)
                running[start_child(run, cont, threads, progress, log=run / "train.log")] = \
                    (name, run, time.perf_counter())
            time.sleep(0.2)
            if running and time.perf_counter() - told >= STATUS_EVERY:
                told = time.perf_counter()
                where = ", ".join(f"{n} step {steps_done(r)}" for n, r, _ in running.values())
                print(f"{total - len(pending) - len(running)}/{total} runs ended | running: {where} | "
                      f"{told - t0:.0f}s elapsed", flush=True)
            for proc in [p for p in running if p.poll() is not None]:
                name, run, t = running.pop(proc)
                print(f"{name}: done (exit code {proc.returncode}) | {time.perf_counter() - t0:.0f}s elapsed",
                      flush=True)
                finish(name, run, proc.returncode, time.perf_counter() - t)
    except BaseException as e:
        if running:
            if not isinstance(e, KeyboardInterrupt) or isinstance(e, RunInterrupted):
                for proc in running:
                    proc.send_signal(signal.SIGINT)
            print(f"stopping: waiting for {', '.join(n for n, _, _ in running.values())} to save and exit",
                  file=sys.stderr, flush=True)
            wait_all(list(running))
        raise


def main(argv: list[str] | None = None) -> int:
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return train_in_process(Path(argv[0]), "--resume" in argv[1:], progress="--progress" in argv[1:])


if __name__ == "__main__":
    sys.exit(main())
