"""`esopt analyze sensitivity`: how strongly ES's noise moves the agent's score, per sigma, before any training.

A sigma so small that both members of an antithetic pair score the same gives ES no signal: the z-scored
weights of such pairs cancel. A sigma so large that every member breaks gives a signal about broken models.
The probe picks sigma by `pair_disagreement`, the share of antithetic pairs (theta + sigma eps, theta - sigma eps)
whose two members score differently on the same E tasks with the same sampling seeds (common random numbers,
as in training). For each sigma it runs generation 0 of the run's training config (its members, tasks and
rollout seed), without an update, and reports the disagreement, the mean |f+ - f-| of the pairs, the fitness
spread, and D, the dimension the noise searches.

    esopt analyze sensitivity --preset smollm2 --h-stars 1 --sigmas 1e-3 4e-3 1.6e-2 --out /tmp/s
    esopt analyze sensitivity --preset smollm2 --h-stars 1 --sigmas 1e-2 3e-2 1e-1 \\
        --set es.scope=regex es.scope_pattern=norm                # noise on the norms only
    esopt analyze sensitivity --config configs/smollm2_math.yaml --sigmas 1e-4 1e-3 \\
        --set model.name=gemma3-270m es.tasks_per_member=8        # any ES training config, any env
    esopt analyze sensitivity --smoke --out /tmp/s                 # seconds (tests)

The run config comes from `esopt bench horizon`'s options (preset, H*, population, episodes per step, --set), or
with --config from a training config file (with --set on top), as `esopt train` reads it.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from esopt.utils.report import add_analysis_options, cpu_model, write_report


def build_parser() -> argparse.ArgumentParser:
    from esopt.experiments.horizon import build_parser as horizon_parser

    p = argparse.ArgumentParser(prog="esopt analyze sensitivity", description=__doc__.split("\n\n")[0],
                                parents=[horizon_parser()], add_help=False, conflict_handler="resolve",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sigmas", nargs="+", type=float, help="sigmas to probe (default 1e-3 2e-3 4e-3 8e-3)")
    p.add_argument("--seed", type=int, default=None,
                   help="the run seed whose generation 0 is probed (default: 0, or the --config file's seed)")
    p.add_argument("--config", metavar="FILE",
                   help="probe this ES training config (and --set) instead of a horizon-bench preset")
    add_analysis_options(p, "OUT/sensitivity.md and .json")
    return p


def probe(config, sigmas: list[float], progress: bool = False) -> list[dict]:
    """Generation 0 of `config` at each sigma: [{sigma, pair_disagreement, pair_gap, fitness_std, ...}]."""
    from esopt.es import ES
    from esopt.es.shaping import pair_disagreement
    from esopt.train.es import generation_tasks, population_evaluator, population_fitness
    from esopt.train.evaluate import member_spec, rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory
    from esopt.utils.progress import say

    make_env = env_factory(config)
    policy = load_model(config.model, config.env.kwargs)
    es = ES(policy.model, config.es_config, on_weights_changed=policy.weights_changed)
    evaluator = population_evaluator(config, es, policy, make_env, progress=progress)
    spec = member_spec(rollout_spec(config, make_env), config)
    tasks = generation_tasks(config, 0)
    rollout_seed = int(np.random.default_rng([config.seed, 0, 3]).integers(2**31))  # as ESAlgorithm.step
    rows = []
    try:
        for sigma in sigmas:
            t = time.perf_counter()
            members = es.ask(0)
            results = evaluator.evaluate(members, sigma, tasks, rollout_seed, spec)
            fitness = population_fitness(results, config)
            plus, minus = fitness[0::2], fitness[1::2]
            rows.append({"sigma": sigma, "pair_disagreement": pair_disagreement(fitness, [m.sign for m in members]),
                         "pair_gap": float(np.abs(plus - minus).mean()), "fitness_mean": float(fitness.mean()),
                         "fitness_std": float(fitness.std()), "seconds": time.perf_counter() - t})
            say(f"sigma {sigma:.3g}: pairs that differ {rows[-1]['pair_disagreement']:.2f}, fitness mean "
                f"{rows[-1]['fitness_mean']:.3f} | {rows[-1]['seconds']:.0f}s", progress)
    finally:
        evaluator.close()
    d = es.perturbation.searched_dimension
    return [{**r, "dimension": d} for r in rows]


def _config(args: argparse.Namespace):
    """The ES training config to probe: the --config file's, or the horizon bench's run config."""
    from esopt.experiments.horizon import plan_from_args, run_config
    from esopt.train.config import load_config

    if args.config:
        config = load_config(args.config, [*args.overrides, *([] if args.seed is None else [f"seed={args.seed}"])])
        if config.algo != "es":
            raise ValueError(f"--config {args.config}: algo is {config.algo!r}; the probe perturbs an ES run's "
                             "members, so it needs algo: es")
        return config
    if args.smoke:
        args.preset = "smoke"
    plan = plan_from_args(args)
    return run_config(plan, "es", plan.h_stars[0], 0 if args.seed is None else args.seed)


def report(rows: list[dict], config, argv: list[str]) -> str:
    e = config.es
    lines = [
        "# ES sensitivity: antithetic pairs that score differently, per sigma",
        "",
        f"{config.env.id} (H*={config.env.kwargs.get('h_star')}), model {config.model.name}, "
        f"G={e.population_size} antithetic, E={e.tasks_per_member} tasks per member, noise {e.noise} "
        f"(rank {e.noise_rank}), scope {e.scope} {e.scope_pattern or ''}, fitness "
        f"{e.fitness}, score {e.reward}, D={rows[0]['dimension']:,}; CPU {cpu_model()}",
        "",
        "| sigma | pairs that differ | mean pair gap | fitness mean | fitness std | s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['sigma']:.3g} | {r['pair_disagreement']:.2f} | {r['pair_gap']:.3f} | {r['fitness_mean']:.3f} | "
              f"{r['fitness_std']:.3f} | {r['seconds']:.0f} |" for r in rows]
    lines += ["", f"Command: `esopt analyze sensitivity {' '.join(argv)}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    config = _config(args)
    if not config.es.antithetic:
        config.es.antithetic = True  # pairs are what the probe compares
    sigmas = args.sigmas or ([1e-3, 1e-1] if args.smoke else [1e-3, 2e-3, 4e-3, 8e-3])
    if bad := [s for s in sigmas if not s > 0]:
        raise ValueError(f"--sigmas must be positive, got {bad}")
    rows = probe(config, sigmas, progress=not args.quiet)
    write_report(args.out, "sensitivity", report(rows, config, argv),
                 {"rows": rows, "config": config.model_dump(mode="json"), "cpu": cpu_model()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
