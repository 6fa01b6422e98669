"""`esopt demo` / `make demo`: ES fine-tunes an agent and shows before/after on held-out puzzles.

Default: SmolLM2-135M-Instruct (pretrained, fp32, all parameters) on one-move 4x4 Sudoku whose observation
lists each empty cell's candidate digits, with two worked episodes in the prompt (`configs/demo.yaml`); the
setting and its measured gains over seeds and thread counts: results/horizon_pretrained.md, "The demo".
`--tiny`: the warm-started 1M-parameter Llama (`configs/demo_tiny.yaml`): the machinery only, no gain
(results/es_step_probe.md). `--quick` shrinks either to about a minute (smoke tests).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
DEMOS = {"smollm2": CONFIGS / "demo.yaml", "tiny": CONFIGS / "demo_tiny.yaml"}
QUICK = {
    "smollm2": ["steps=1", "es.population_size=2", "es.tasks_per_member=4", "eval.tasks=8", "eval.every=0"],
    "tiny": ["steps=2", "model.warm_start_steps=60", "es.population_size=4", "es.tasks_per_member=4",
             "eval.tasks=8", "eval.repeats=1", "eval.every=0"],
}
# wall-clock of the demo on a 2-core machine, set-up excluded (measured from fresh clones: README)
EXPECTED_MINUTES = {"smollm2": "3-8", "tiny": "10"}
SETUP = {"smollm2": "model conversion", "tiny": "warm start"}  # what `_prepare` builds (cached afterwards)


def _prepare(config, which: str) -> None:
    """Build (or find) the cached model in a child process: SmolLM2's conversion from its GGUF, or the tiny
    model's supervised warm start. Their memory then does not count in this process's peak (the ES /
    inference-only ratio), and the set-up time is its own line."""
    import subprocess
    import sys

    if which == "tiny":
        env = config.env.kwargs
        code = ("import sys; from esopt.train.sft import warm_start_path; "
                "warm_start_path(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")
        args = [str(env["size"]), str(config.model.warm_start_steps), str(config.model.seed)]
    else:
        code, args = "from esopt.models.smollm2 import smollm2_path; smollm2_path()", []
    if subprocess.run([sys.executable, "-c", code, *args]).returncode:
        raise SystemExit(f"demo set-up failed ({SETUP[which]}): see the error above")


def run_demo(out: str | Path = "runs/demo", quick: bool = False, tiny: bool = False) -> int:
    import shutil

    import torch

    from esopt.train.config import load_config
    from esopt.train.es import train

    which = "tiny" if tiny else "smollm2"
    if "OMP_NUM_THREADS" not in os.environ:
        # the tiny model runs fastest on one thread; SmolLM2's matmuls use every core this process may run on
        torch.set_num_threads(1 if tiny else max(1, min(len(os.sched_getaffinity(0)), 4)))
    t0 = time.perf_counter()
    config = load_config(DEMOS[which], QUICK[which] if quick else [])
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)  # the demo always starts fresh; `esopt train` never overwrites a run
    env = config.env.kwargs
    model = ("a warm-started tiny Llama (~1M params)" if tiny
             else f"SmolLM2-135M-Instruct (pretrained, {config.model.resolved_dtype})")
    print(f"agentic-esopt demo: ES fine-tuning of {model} on {env['size']}x{env['size']} Sudoku, H*={env['h_star']}, "
          f"T={config.sampling.temperature}, {config.steps} generations x {config.es.population_size} members x "
          f"{config.es.tasks_per_member} tasks")
    if not quick:
        print(f"expected length: about {EXPECTED_MINUTES[which]} minutes on 2 CPU cores (set-up excluded)")
    _prepare(config, which)
    t_prep = time.perf_counter() - t0
    summary = train(config, out, progress=True)
    print_before_after(config, summary, t_prep, which, out)
    return 0


def print_before_after(config, summary: dict, t_prep: float, which: str, out: Path) -> None:
    from esopt.utils.memory import fmt_bytes, steady_malloc_active
    from esopt.utils.stats import mcnemar_p, paired_difference

    before, after = summary["eval_before"], summary["eval_after"]
    n = config.eval.tasks * config.eval.repeats
    print()
    print(f"held-out puzzles ({config.eval.split} split): {config.eval.tasks} x {config.eval.repeats} rollouts = "
          f"{n} episodes")
    base_name = "warm start" if which == "tiny" else "base model"
    print(f"{'metric':<22}{base_name:>12}{'ES fine-tuned':>15}{'change':>10}")
    for key, label in [("success_rate", "success rate"), ("mean_reward", "mean reward"),
                       ("valid_action_rate", "valid action rate"), ("correct_given_valid", "correct given valid"),
                       ("mean_turns", "mean turns"), ("shaped_reward", "shaped reward")]:
        print(f"{label:<22}{before[key]:>12.3f}{after[key]:>15.3f}{after[key] - before[key]:>+10.3f}")
    for key, label in [("episode_success", "success"), ("episode_shaped", "shaped reward")]:
        d = paired_difference(before[key], after[key], tasks=config.eval.tasks)
        verdict = "an improvement" if d.low > 0 else "a drop" if d.high < 0 else "not distinguishable from no change"
        print(f"{label} change {d.mean:+.3f}, 95% CI [{d.low:+.3f}, {d.high:+.3f}] "
              f"(paired bootstrap over {d.tasks} tasks): {verdict}")
    p = mcnemar_p(before["episode_success"], after["episode_success"])
    print(f"puzzles solved by one model only: McNemar p = {p:.2g}")
    split = summary["time_split"]
    ratio = (f"{summary['memory_ratio']:.3f}" if summary["memory_ratio"]
             else "not measured here (esopt bench efficiency compares them)")
    steady = steady_malloc_active()  # `esopt demo` restarts itself with it
    print(f"peak memory {fmt_bytes(summary['peak_memory_bytes'])}; ES / inference-only (same model, batch"
          f"{', fixed malloc threshold' if steady else ''}) = {ratio}")
    print(f"wall-clock: set-up ({SETUP[which]}, cached after the first run) {t_prep:.0f}s, "
          f"ES with its evals {summary['seconds']:.0f}s "
          f"({summary['seconds_per_step']:.1f}s per generation); ES overhead (perturb {split['perturb']:.1f}s + "
          f"restore {split['restore']:.1f}s + update {split['update']:.1f}s) = {split['es_overhead_share']:.1%} "
          f"of ES + rollout time ({split['rollout']:.0f}s)")
    print(f"plots: {out / 'plots'}; run directory: {out} (esopt replay {out} --out DIR rebuilds the weights)")
