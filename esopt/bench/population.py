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
    "full-rank sequential": ["es.noise=normal"],
    "low-rank in place": ["es.noise=lowrank"],
    "low-rank batched": ["es.noise=lowrank", "es.batched=true"],
}
BASE = {"tiny": "smoke", "smollm2": "demo"}


def measure(model: str, members: int, tasks: int, rank: int, repeats: int, overrides: list[str],
            ray_workers: list[int] | None = None) -> dict:
    from esopt.es import ES
    from esopt.train.common import Timers, env_factory, load_model
    from esopt.train.config import load_config
    from esopt.train.es import BatchedEvaluator, LocalEvaluator

    common = [f"es.population_size={members}", "es.antithetic=true", f"es.tasks_per_member={tasks}",
              f"es.noise_rank={rank}", "sampling.temperature=0", "max_batch_size=null", *overrides]
    rows = []
    policy = None
    for mode in MODES:
        config = load_config(BASE[model], [*common, *MODE_OVERRIDES[mode]])
        if policy is None:
            policy = load_model(config.model, config.env.kwargs)
        make = env_factory(config)
        es = ES(policy.model, config.strategy)
        timers = Timers()
        evaluator = (BatchedEvaluator(es, policy, make, config, timers) if config.es.batched
                     else LocalEvaluator(es, policy, make, config, timers, progress=False))
        task_seeds = list(range(1000, 1000 + tasks))
        times = []
        for g in range(repeats):
            pop = es.ask(g)
            t = time.perf_counter()
            evaluator.evaluate(pop, es.sigma, task_seeds, rollout_seed=g)
            times.append(time.perf_counter() - t)
        best = min(times)
        rows.append({"mode": mode, "seconds": best, "member_episodes_per_second": members * tasks / best,
                     "perturb": timers.perturb / repeats, "restore": timers.restore / repeats})
        print(f"{mode}: {best:.2f}s per generation, {members * tasks / best:.1f} member-episodes/s", flush=True)
        del es
    for workers in ray_workers or []:
        rows.append(_measure_ray(BASE[model], common, workers, members, tasks, repeats, policy))
    return {"model": model, "members": members, "tasks": tasks, "rank": rank, "repeats": repeats,
            "threads": torch.get_num_threads(), "rows": rows}


def _measure_ray(base: str, common: list[str], workers: int, members: int, tasks: int, repeats: int, policy) -> dict:
    import tempfile

    from esopt.es import ES
    from esopt.train.config import load_config
    from esopt.train.distributed import RayEvaluator

    config = load_config(base, [*common, "distributed.backend=ray", f"distributed.workers={workers}"])
    es = ES(policy.model, config.strategy)
    with tempfile.TemporaryDirectory(prefix="esopt-bench-") as tmp:
        evaluator = RayEvaluator(config, policy.model, [], tmp, log=lambda m: None)
        try:
            evaluator.evaluate(es.ask(0)[:workers], es.sigma, [1000], rollout_seed=0)  # replicas are up
            times = []
            for g in range(repeats):
                t = time.perf_counter()
                evaluator.evaluate(es.ask(g), es.sigma, list(range(1000, 1000 + tasks)), rollout_seed=g)
                times.append(time.perf_counter() - t)
        finally:
            evaluator.close()
    best = min(times)
    mode = f"ray, {workers} worker{'s' if workers > 1 else ''}"
    print(f"{mode}: {best:.2f}s per generation, {members * tasks / best:.1f} member-episodes/s", flush=True)
    return {"mode": mode, "seconds": best, "member_episodes_per_second": members * tasks / best,
            "perturb": None, "restore": None}


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
