"""`esopt bench population`: member-episodes per second of one ES generation, by population backend.

Side by side in one process, on the same model, tasks and members (G members x E tasks, greedy decoding):
- `full-rank sequential`: dense Gaussian noise, members perturbed in place one after another;
- `low-rank in place`: rank-r noise written into the weights, members one after another;
- `low-rank batched`: base weights untouched, all G x E episodes in one batched rollout, each row adding
  its member's low-rank term;
- `ray, 1 worker` and `ray, 2 workers` (`--ray`): full-rank members on Ray actors, one model replica each
  (start-up excluded: replicas are built before the clock starts).

    esopt bench population --model tiny --members 32 --tasks 4
    esopt bench population --model smollm2 --members 32 --tasks 4 --ray 1 2

The in-process backends use every core (`--threads`); each Ray worker uses one thread, so 2 workers use
the same 2 cores as the in-process rows on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from esopt.utils.report import write_report

MODES = ("full-rank sequential", "low-rank in place", "low-rank batched")
MODE_OVERRIDES = {
    "full-rank sequential": ["es.noise=normal", "es.batched=false"],  # the demo's config is batched
    "low-rank in place": ["es.noise=lowrank", "es.batched=false"],
    "low-rank batched": ["es.noise=lowrank", "es.batched=true"],
}
BASE = {"tiny": "smoke", "smollm2": "demo"}


def measure(model: str, members: int, tasks: int, rank: int, repeats: int, overrides: list[str],
            ray_workers: list[int] | None = None) -> dict:
    from esopt.train.config import load_config
    from esopt.train.models import load_model

    common = [f"es.population_size={members}", "es.antithetic=true", f"es.tasks_per_member={tasks}",
              f"es.noise_rank={rank}", "sampling.temperature=0", "max_batch_size=null", *overrides]
    modes = [(m, MODE_OVERRIDES[m]) for m in MODES]
    ray = [*MODE_OVERRIDES["full-rank sequential"], "distributed.backend=ray"]
    modes += [(f"ray, {w} worker{'s' if w > 1 else ''}", [*ray, f"distributed.workers={w}"]) for w in ray_workers or []]
    rows, policy = [], None
    for mode, extra in modes:
        config = load_config(BASE[model], [*common, *extra])
        if policy is None:
            policy = load_model(config.model, config.env.kwargs)
        rows.append(_measure_mode(mode, config, policy, members, tasks, repeats))
    return {"model": model, "members": members, "tasks": tasks, "rank": rank, "repeats": repeats,
            "threads": torch.get_num_threads(), "rows": rows}


def _measure_mode(mode: str, config, policy, members: int, tasks: int, repeats: int) -> dict:
    """Best of `repeats` generations of one backend; Ray replicas are built (one warm-up call) before timing."""
    import tempfile

    from esopt.es import ES
    from esopt.train.es import population_evaluator
    from esopt.train.evaluate import member_spec, rollout_spec
    from esopt.train.tasks import env_factory
    from esopt.utils.timers import Timers

    make, timers = env_factory(config), Timers()
    es, spec, task_seeds = (
        ES(policy.model, config.es_config),
        member_spec(rollout_spec(config, make), config),
        list(range(1000, 1000 + tasks)),
    )
    with tempfile.TemporaryDirectory(prefix="esopt-bench-") as tmp:
        evaluator = population_evaluator(config, es, policy, make, timers, run_dir=tmp, log=lambda m: None)
        try:
            if config.population_evaluator == "ray":
                workers = config.distributed.workers
                evaluator.evaluate(es.ask(0)[:workers], es.sigma, task_seeds[:1], 0, spec)
            times = []
            for g in range(repeats):
                pop = es.ask(g)
                t = time.perf_counter()
                evaluator.evaluate(pop, es.sigma, task_seeds, g, spec)
                times.append(time.perf_counter() - t)
        finally:
            evaluator.close()
    best = min(times)
    print(f"{mode}: {best:.2f}s per generation, {members * tasks / best:.1f} member-episodes/s", flush=True)
    in_process = config.population_evaluator != "ray"
    return {"mode": mode, "seconds": best, "member_episodes_per_second": members * tasks / best,
            "perturb": timers.perturb / repeats if in_process else None,
            "restore": timers.restore / repeats if in_process else None}


def report(result: dict) -> str:
    base = result["rows"][0]["member_episodes_per_second"]
    lines = [f"model {result['model']}, G={result['members']} members x E={result['tasks']} tasks, rank "
             f"{result['rank']}, greedy, {result['threads']} threads, best of {result['repeats']}", "",
             "| backend | seconds per generation | member-episodes/s | vs full-rank sequential |", "|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['mode']} | {r['seconds']:.2f} | {r['member_episodes_per_second']:.1f} | "
                     f"{r['member_episodes_per_second'] / base:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="esopt bench population", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(BASE), default="tiny")
    p.add_argument("--members", type=int, default=32)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the in-process backends (default: every core this process may use)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--ray", nargs="*", type=int, default=None, metavar="N",
                   help="also Ray with N workers each (e.g. --ray 1 2; one torch thread per worker)")
    p.add_argument("--out", default=None, help="also write OUT/population.md and .json")
    args = p.parse_args(argv)
    if args.members < 2 or args.members % 2 or args.tasks < 1:
        raise ValueError("--members must be an even number >= 2 and --tasks >= 1")
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    result = measure(args.model, args.members, args.tasks, args.rank, args.repeats, args.set, args.ray)
    if args.out:
        write_report(args.out, "population", report(result), result)
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
