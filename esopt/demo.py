"""`esopt demo` / `make demo`: warm-start a tiny Llama on Sudoku, fine-tune it with ES, show before/after.

The ES run is `configs/demo.yaml`; `--quick` shrinks it to about a minute (for smoke tests).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"
QUICK = ["steps=2", "model.warm_start_steps=60", "es.population_size=4", "es.tasks_per_member=4",
         "eval.tasks=8", "eval.repeats=1", "eval.every=0"]


def run_demo(out: str | Path = "runs/demo", quick: bool = False) -> int:
    import shutil

    import torch

    from esopt.train.config import load_config
    from esopt.train.es import train
    from esopt.utils.memory import fmt_bytes
    from esopt.utils.stats import paired_difference

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # measured faster than 2 threads for a 1M-parameter model
    t0 = time.perf_counter()
    config = load_config(DEMO_CONFIG, QUICK if quick else [])
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)  # the demo always starts fresh; `esopt train` never overwrites a run
    env = config.env.kwargs
    print(f"agentic-esopt demo: ES fine-tuning of a warm-started tiny Llama on {env['size']}x{env['size']} Sudoku, "
          f"H*={env['h_star']} (turn cap {3 * env['h_star']}), T={config.sampling.temperature}")
    # Build (or find) the cached warm start in a child process, so the supervised pretraining's
    # backprop memory does not count in this process's peak (the ES / inference-only ratio).
    import subprocess
    import sys

    code = ("import sys; from esopt.train.common import warm_start_path; "
            "warm_start_path(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")
    subprocess.run([sys.executable, "-c", code, str(env["size"]), str(config.model.warm_start_steps),
                    str(config.model.seed)], check=True)
    t_warm = time.perf_counter() - t0
    summary = train(config, out, progress=True)
    before, after = summary["eval_before"], summary["eval_after"]
    n = config.eval.tasks * config.eval.repeats
    print()
    print(f"held-out puzzles: {config.eval.tasks} x {config.eval.repeats} rollouts = {n} episodes")
    print(f"{'metric':<22}{'warm start':>12}{'ES fine-tuned':>15}{'change':>10}")
    for key, label in [("success_rate", "success rate"), ("mean_reward", "mean reward"),
                       ("valid_action_rate", "valid action rate"), ("mean_turns", "mean turns"),
                       ("shaped_reward", "shaped reward")]:
        print(f"{label:<22}{before[key]:>12.3f}{after[key]:>15.3f}{after[key] - before[key]:>+10.3f}")
    for key, label in [("episode_success", "success"), ("episode_shaped", "shaped reward")]:
        d = paired_difference(before[key], after[key], tasks=config.eval.tasks)
        verdict = "an improvement" if d.low > 0 else "a drop" if d.high < 0 else "not distinguishable from no change"
        print(f"{label} change {d.mean:+.3f}, 95% CI [{d.low:+.3f}, {d.high:+.3f}] "
              f"(paired bootstrap over {d.tasks} tasks): {verdict}")
    split = summary["time_split"]
    ratio = f"{summary['memory_ratio']:.3f}" if summary["memory_ratio"] else "n/a"
    print(f"peak memory {fmt_bytes(summary['peak_memory_bytes'])}; ES / inference-only (same model, batch) = {ratio}")
    print(f"wall-clock: warm start {t_warm:.0f}s, ES {summary['seconds']:.0f}s "
          f"({summary['seconds_per_step']:.1f}s per generation); ES overhead (perturb {split['perturb']:.1f}s + "
          f"restore {split['restore']:.1f}s + update {split['update']:.1f}s) = {split['es_overhead_share']:.1%} "
          f"of ES + rollout time ({split['rollout']:.0f}s)")
    print(f"plots: {out / 'plots'}; run directory: {out} (esopt replay {out} --out DIR rebuilds the weights)")
    return 0
