"""The sweep runner every multi-run experiment shares: train each named config into ROOT/NAME unless it is
finished, continue partial runs on `resume`, optionally each in a fresh process (honest per-run peak memory),
and record each run's wall-clock in ROOT/NAME/bench.json. A failed run is reported and left out, not fatal.

    python -m esopt.experiments.sweep RUN_DIR [--resume] [--progress]    # the child process of one isolated run
"""

from __future__ import annotations

import json
import os
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


def train_in_child(run: Path, resume: bool, threads: int, progress: bool = False) -> int:
    """Train one run in a fresh process; with `progress` it writes progress to the inherited stderr (plain lines
    in a log file, bars on a terminal)."""
    cmd = [sys.executable, "-m", "esopt.experiments.sweep", str(run), *(["--resume"] if resume else []),
           *(["--progress"] if progress else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.wait()  # the child got the same SIGINT: let it save its checkpoint first
        raise


def run_sweep(configs: dict, root: Path, resume: bool = False, isolate: bool = False, threads: int = 1,
              progress: bool = False) -> list[str]:
    """Train every config ({name: validated training config}) into root/name; the names of failed runs."""
    from esopt.train.config import dump_config, load_config

    states = {name: run_state(root / name) for name in configs}
    if not resume and (busy := [n for n, s in states.items() if s != "new"]):
        raise FileExistsError(f"{root / busy[0]} already holds a run: pass --resume (skips finished runs, "
                              "continues partial ones) or another --out")
    failed, t0 = [], time.perf_counter()
    for k, (name, config) in enumerate(configs.items()):
        run = root / name
        if states[name] == "done":
            print(f"[{k + 1}/{len(configs)}] {name}: finished, skipped", flush=True)
            continue
        cont = states[name] == "partial"
        if cont and load_config(run / "config.yaml").model_dump() != config.model_dump():
            print(f"warning: {name}: continuing with its stored config.yaml, which differs from this plan",
                  file=sys.stderr)
        elif not cont:
            run.mkdir(parents=True, exist_ok=True)
            dump_config(config, run / "config.yaml")
        print(f"[{k + 1}/{len(configs)}] {name}: {'continuing' if cont else 'training'} "
              f"({config.episodes_per_step} episodes/step, {config.steps} steps) "
              f"| {time.perf_counter() - t0:.0f}s elapsed", flush=True)
        t = time.perf_counter()
        rc = train_in_child(run, cont, threads, progress) if isolate else train_in_process(run, cont, progress)
        if rc == 130:
            raise KeyboardInterrupt
        if rc or not (run / "summary.json").exists():
            failed.append(name)
            print(f"error: {name} failed (exit code {rc}); the report leaves it out", file=sys.stderr)
            continue
        (run / "bench.json").write_text(json.dumps({"wall_seconds": time.perf_counter() - t, "isolated": isolate}))
    return failed


def main(argv: list[str] | None = None) -> int:
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return train_in_process(Path(argv[0]), "--resume" in argv[1:], progress="--progress" in argv[1:])


if __name__ == "__main__":
    sys.exit(main())
