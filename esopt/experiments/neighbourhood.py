"""`esopt analyze neighbourhood`: are there better weights near the base model, and at which sigma?

For each sigma, K random full-parameter perturbations theta + sigma * eps_k (the training run's seeded
noise) are scored on the same training tasks as the base. The top few per sigma are then re-scored on
held-out episodes (the run's `eval` split) and compared with the base, paired, with a bootstrap 95%
interval. A top member that stays better on held-out tasks means better weights are dense near the base
at that sigma ("neural thickets"); one that falls back to the base means its training score was luck.

    esopt analyze neighbourhood --config configs/smollm2_sudoku4.yaml --sigmas 1e-3 3e-3 1e-2 --k 8
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from esopt.utils.report import add_analysis_options, fmt_change, write_report


def measure(config_path: str | None, overrides: list[str], sigmas: list[float], k: int, tasks: int, top: int,
            seed: int = 0, progress: bool = True) -> dict:
    from esopt.es import ES
    from esopt.rollout import trajectory_score
    from esopt.train.config import load_config
    from esopt.train.evaluate import evaluate, rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory, train_task_seeds
    from esopt.utils.stats import paired_difference

    config = load_config(config_path, overrides)
    policy = load_model(config.model, config.env.kwargs)
    make = env_factory(config)
    e = config.es
    train_seeds = train_task_seeds(seed, 0, tasks)
    rollout_seed = int(np.random.default_rng([seed, 0, 3]).integers(2**31))
    t0 = time.perf_counter()

    def train_score() -> float:
        trajectories, _ = rollout_spec(config, make).run(policy, make, train_seeds, seed=rollout_seed)
        return float(np.mean([trajectory_score(t, e.reward) for t in trajectories]))

    base_train = train_score()
    base_eval = evaluate(policy, config, rollout_spec(config, make), make)
    if progress:
        print(f"base: train {base_train:.3f} | held-out success {base_eval['success_rate']:.3f} "
              f"shaped {base_eval['shaped_reward']:.3f} | {time.perf_counter() - t0:.0f}s", flush=True)
    rows = []
    for sigma in sigmas:
        es = ES(policy.model, config.es_config.model_copy(update={
            "population_size": k, "antithetic": False, "sigma": sigma, "sigma_schedule": "constant", "alpha": 0.0,
            "seed": seed}))
        members = es.ask(0)
        scores = []
        for m in members:
            with es.perturbed(m):
                scores.append(train_score())
        order = np.argsort(scores)[::-1][:top]
        row = {"sigma": sigma, "train_scores": scores, "rescored": []}
        for i in order:
            with es.perturbed(members[int(i)]):
                ev = evaluate(policy, config, rollout_spec(config, make), make)
            ds = paired_difference(base_eval["episode_success"], ev["episode_success"], config.eval.tasks)
            dh = paired_difference(base_eval["episode_shaped"], ev["episode_shaped"], config.eval.tasks)
            row["rescored"].append({"member": int(i), "train": scores[int(i)], "success": ev["success_rate"],
                                    "shaped": ev["shaped_reward"], "valid": ev["valid_action_rate"],
                                    "correct_given_valid": ev["correct_given_valid"],
                                    "d_success": list(ds[:3]), "d_shaped": list(dh[:3])})
        rows.append(row)
        del es  # drops its fp32 master copy before the next sigma
        if progress:
            best = row["rescored"][0]
            print(f"sigma {sigma:g}: train {min(scores):.3f}..{max(scores):.3f} (base {base_train:.3f}) | best "
                  f"held-out shaped change {best['d_shaped'][0]:+.3f} | {time.perf_counter() - t0:.0f}s", flush=True)
    return {"config": config.model_dump(mode="json"), "overrides": overrides, "k": k, "tasks": tasks, "top": top,
            "seed": seed, "base_train": base_train, "eval_episodes": len(base_eval["episode_success"]),
            "base_eval": {key: base_eval[key] for key in ("success_rate", "shaped_reward", "valid_action_rate",
                                                          "correct_given_valid")},
            "rows": rows, "seconds": time.perf_counter() - t0}


def report(result: dict) -> str:
    c, b = result["config"], result["base_eval"]
    lines = [
        "# Neighbourhood of the base weights", "",
        f"Model {c['model']['name']}, env {c['env']['kwargs']}, few-shot {c['env']['few_shot']}, "
        f"T={c['sampling']['temperature']}, member score `{c['es']['reward']}`. K={result['k']} perturbations "
        f"per sigma scored on {result['tasks']} training tasks (base {result['base_train']:.3f}); the top "
        f"{result['top']} re-scored on {result['eval_episodes']} held-out `{c['eval']['split']}` episodes (base "
        f"success {b['success_rate']:.3f}, shaped {b['shaped_reward']:.3f}, valid {b['valid_action_rate']:.3f}, "
        f"correct given valid {b['correct_given_valid']:.3f}). Changes: paired bootstrap 95% intervals. "
        f"{result['seconds']:.0f}s.", "",
        "| sigma | train scores (min / median / max) | member | its train score | held-out success | success change "
        "[95% CI] | shaped change [95% CI] | valid | correct given valid |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        s = np.array(row["train_scores"])
        spread = f"{s.min():.3f} / {np.median(s):.3f} / {s.max():.3f}"
        for r in row["rescored"]:
            lines.append(f"| {row['sigma']:g} | {spread} | {r['member']} | {r['train']:.3f} | {r['success']:.3f} | "
                         f"{fmt_change(r['d_success'])} | {fmt_change(r['d_shaped'])} | "
                         f"{r['valid']:.3f} | {r['correct_given_valid']:.3f} |")
    return "\n".join(lines) + "\n"


SMOKE = ["model.warm_start_steps=60", "env.kwargs.h_star=2", "eval.tasks=4", "eval.repeats=1"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt analyze neighbourhood", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="training config whose model, env, sampling, reward and eval are used")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--sigmas", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2])
    p.add_argument("--k", type=int, default=8, help="perturbations per sigma")
    p.add_argument("--tasks", type=int, default=64, help="training tasks each perturbation is scored on")
    p.add_argument("--top", type=int, default=2, help="best perturbations per sigma re-scored on held-out tasks")
    p.add_argument("--seed", type=int, default=0)
    add_analysis_options(p, "OUT/neighbourhood.md and .json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.set, args.sigmas, args.k, args.tasks, args.top = [*SMOKE, *args.set], [1e-2], 2, 2, 1
    if args.k < 1 or args.tasks < 1 or not 1 <= args.top <= args.k or any(s <= 0 for s in args.sigmas):
        raise ValueError("need --k >= 1, --tasks >= 1, 1 <= --top <= --k and every sigma > 0")
    result = measure(args.config, args.set, args.sigmas, args.k, args.tasks, args.top, args.seed,
                     progress=not args.quiet)
    write_report(args.out, "neighbourhood", report(result), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
