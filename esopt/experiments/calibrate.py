"""`esopt analyze calibrate`: a model's base behaviour on a grid of task settings, before any training.

For every (board size, H*, temperature) it runs the same validation episodes and reports success, the
valid-action rate, correctness given a valid action, mean turns and the shaped score, so a training
setting can be picked where base success is neither ~0 nor saturated and the errors are ones a small
change of behaviour could fix. The model is loaded once; env options are training-config overrides.

    esopt analyze calibrate --set model.name=smollm2 env.few_shot=2 env.kwargs.show_empty=true \\
        --sizes 4 --h-stars 1 2 3 --temperatures 0 0.7 --episodes 256
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from esopt.utils.report import add_analysis_options, write_report


def measure(overrides: list[str], sizes: list[int], h_stars: list[int], temperatures: list[float], episodes: int,
            progress: bool = True) -> dict:
    from esopt.rollout import summarize
    from esopt.train.config import load_config
    from esopt.train.evaluate import rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory, heldout_task_seeds

    base = load_config(None, overrides)
    policy = load_model(base.model, base.env.kwargs)
    rows, t0 = [], time.perf_counter()
    for size in sizes:
        for h in h_stars:
            # the validation split: choosing a task setting is tuning, and the test split is for reporting
            config = load_config(None, [*overrides, f"env.kwargs.size={size}", f"env.kwargs.h_star={h}",
                                        f"eval.tasks={episodes}", "eval.repeats=1", "eval.split=validation"])
            make = env_factory(config)
            for temperature in temperatures:
                sampling = config.sampling.model_copy(update={"temperature": temperature}).params()
                t = time.perf_counter()
                spec = rollout_spec(config, make).replace(sampling=sampling)
                trajectories, stats = spec.run(policy, make, heldout_task_seeds(config), seed=config.eval.seed)
                row = {"size": size, "h_star": h, "temperature": temperature, "episodes": episodes,
                       **summarize(trajectories), "seconds": time.perf_counter() - t,
                       "prompt_tokens_per_turn": stats.prompt_tokens / max(stats.turns, 1)}
                rows.append(row)
                if progress:
                    print(f"{size}x{size} H*={h} T={temperature:g}: success {row['success_rate']:.3f} valid "
                          f"{row['valid_action_rate']:.3f} correct|valid {row['correct_given_valid']:.3f} "
                          f"({row['seconds']:.0f}s)", flush=True)
    return {"overrides": overrides, "model": base.model.name, "rows": rows, "seconds": time.perf_counter() - t0}


def report(result: dict) -> str:
    lines = [f"# Base behaviour of `{result['model']}` ({' '.join(result['overrides'])})", "",
             "| board | H* | T | episodes | success | valid actions | correct given valid | mean turns | shaped | "
             "prompt tokens/turn | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['size']}x{r['size']} | {r['h_star']} | {r['temperature']:g} | {r['episodes']} | "
                     f"{r['success_rate']:.3f} | {r['valid_action_rate']:.3f} | {r['correct_given_valid']:.3f} | "
                     f"{r['mean_turns']:.2f} | {r['shaped_reward']:.3f} | {r['prompt_tokens_per_turn']:.0f} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt analyze calibrate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="training-config overrides (model, env options, sampling)")
    p.add_argument("--sizes", nargs="+", type=int, default=[4])
    p.add_argument("--h-stars", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    p.add_argument("--episodes", type=int, default=256, help="held-out episodes per setting")
    add_analysis_options(p, "OUT/calibration.md and .json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.h_stars, args.temperatures, args.episodes = [2], [0.0], 4
    if args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    result = measure(args.set, args.sizes, args.h_stars, args.temperatures, args.episodes, progress=not args.quiet)
    write_report(args.out, "calibration", report(result), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
