"""`esopt analyze step`: does one ES step help on held-out episodes, and is it better than a random step?

From the model a training config starts with (default: the demo's warm-started tiny Llama), one ES
gradient estimate is computed exactly as `esopt train` does it: P antithetic pairs (G = 2P members, the
run's seeded noise), every member scored on the same E training tasks with the same sampling seed (common
random numbers), z-scored rewards. The update direction is d = 1/G sum_i w_i sign_i eps_i, so a step of
alpha is theta + alpha * d, the training loop's update. Each step is judged on the run's held-out set
(`eval.tasks` x `eval.repeats` episodes, the same episodes and sampling seeds for every model), as a paired
bootstrap 95% interval of the change against the unstepped model, for:
- `es`: the ES direction, at each alpha;
- `permuted` (control): the same per-seed coefficients assigned to the seeds in a random order, i.e. a
  step of the same length built from the same noise, but carrying no information from the rewards. ES is
  only doing its job where `es` beats `permuted`;
- `--groups REGEX ...`: the ES step restricted to the parameters whose names match each regex.

    esopt analyze step                                  # demo config: 64 pairs x 12 tasks, sigma 1e-3
    esopt analyze step --pairs 16 --tasks 48 --alphas 0.002 0.005 0.01
    esopt analyze step --groups embed "[vo]_proj" "[qk]_proj" mlp norm --alphas 0.01
    esopt analyze step --set sampling.temperature=0     # any training-config override

Measured (2 CPU cores, one torch thread): 64 x 12 episodes ~45 s, then ~25 s per held-out evaluation of
1024 episodes; the default (3 alphas x 2 variants + base) takes about 4 minutes.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from esopt.utils.report import add_analysis_options, fmt_change, write_report

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo_tiny.yaml"


@dataclass
class Setup:
    config: str = str(DEMO_CONFIG)
    overrides: list[str] = field(default_factory=list)
    pairs: int = 64  # P antithetic pairs: G = 2P members
    tasks: int = 12  # E training tasks per member (shared by all members)
    sigma: float | None = None  # None: the config's es.sigma
    alphas: list[float] = field(default_factory=lambda: [0.002, 0.005, 0.01])
    groups: list[str] = field(default_factory=list)
    control: bool = True  # also evaluate the permuted-coefficient control
    pair_tasks: bool = False  # each antithetic pair gets its own tasks and sampling seed (default: all share)
    seed: int = 0

    def check(self) -> None:
        if self.pairs < 1 or self.tasks < 1:
            raise ValueError(f"--pairs and --tasks must be >= 1, got {self.pairs} and {self.tasks}")
        if (self.sigma is not None and not self.sigma > 0) or not self.alphas or any(a <= 0 for a in self.alphas):
            raise ValueError(f"sigma and every alpha must be > 0, got sigma={self.sigma}, alphas={self.alphas}")
        for g in self.groups:
            try:
                re.compile(g)
            except re.error as e:
                raise ValueError(f"--groups: {g!r} is not a valid regex: {e}") from None


SMOKE = {"overrides": ["model.warm_start_steps=60", "env.kwargs.h_star=3", "eval.tasks=4", "eval.repeats=1"],
         "pairs": 2, "tasks": 2, "alphas": [0.01], "groups": ["norm"]}


def direction(es, members, weights: np.ndarray, shuffle: np.random.Generator | None = None) -> dict[str, torch.Tensor]:
    """1/G sum_i w_i sign_i eps_i per scoped parameter; `shuffle` reassigns the per-seed coefficients."""
    from esopt.es import update_coefficients

    record = {"seeds": [m.seed for m in members], "signs": [m.sign for m in members], "weights": list(weights)}
    coefs = update_coefficients(record)
    seeds, values = list(coefs), [c / len(members) for c in coefs.values()]
    if shuffle is not None:
        values = [values[i] for i in shuffle.permutation(len(values))]
    names = [name for name, _ in es.perturbation.params]
    return dict(zip(names, es.perturbation.combine(dict(zip(seeds, values)))))


def measure(setup: Setup, progress: bool = True) -> dict:
    from esopt.es import ES
    from esopt.es.shaping import get_shaper
    from esopt.population import member_score
    from esopt.train.config import load_config
    from esopt.train.evaluate import evaluate, rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory, train_task_seeds
    from esopt.utils.stats import paired_difference

    setup.check()
    config = load_config(setup.config, setup.overrides)
    policy = load_model(config.model, config.env.kwargs)
    make = env_factory(config)
    e = config.es
    es = ES(policy.model, config.es_config.model_copy(update={
        "population_size": 2 * setup.pairs, "antithetic": True, "sigma": setup.sigma or e.sigma,
        "sigma_schedule": "constant", "alpha": 0.0, "seed": setup.seed}))
    t0 = time.perf_counter()
    members = es.ask(0)
    rewards = []
    for k, m in enumerate(members):
        key = k // 2 if setup.pair_tasks else 0  # members 2j, 2j+1 are pair j
        tasks = train_task_seeds(setup.seed, key, setup.tasks)
        rollout_seed = int(np.random.default_rng([setup.seed, key, 3]).integers(2**31))
        with es.perturbed(m), torch.no_grad():
            trajs, _ = rollout_spec(config, make).run(policy, make, tasks, seed=rollout_seed)
        rewards.append(member_score(trajs, e.reward))
        if progress and (k + 1) % 16 == 0:
            print(f"members {k + 1}/{len(members)} | {time.perf_counter() - t0:.0f}s", flush=True)
    weights = get_shaper(e.shaping)(np.array(rewards))
    steps = {"es": direction(es, members, weights)}
    if setup.control:
        steps["permuted"] = direction(es, members, weights, np.random.default_rng([setup.seed, 5]))

    def place(step: dict[str, torch.Tensor] | None, alpha: float, group: str | None) -> float:
        """theta = the unperturbed weights (the ES's fp32 masters) + alpha * step on the chosen group."""
        sq = 0.0
        with torch.no_grad():
            for (n, p), master in zip(es.perturbation.params, es.perturbation.masters):
                master = master.view(p.shape).to(p.device)
                delta = step[n] * alpha if step is not None and (group is None or re.search(group, n)) else None
                p.copy_(master if delta is None else master + delta)
                sq += float(delta.square().sum()) if delta is not None else 0.0
        return sq**0.5

    place(None, 0.0, None)
    base = evaluate(policy, config, rollout_spec(config, make), make)
    tasks_eval = config.eval.tasks
    rows = []
    plan = [(v, a, None) for a in setup.alphas for v in steps] + [
        ("es", a, g) for g in setup.groups for a in setup.alphas
    ]
    for variant, alpha, group in plan:
        norm = place(steps[variant], alpha, group)
        ev = evaluate(policy, config, rollout_spec(config, make), make)
        ds = paired_difference(base["episode_success"], ev["episode_success"], tasks_eval)
        dh = paired_difference(base["episode_shaped"], ev["episode_shaped"], tasks_eval)
        rows.append({"variant": variant, "group": group or "all", "alpha": alpha, "step_norm": norm,
                     "success": ev["success_rate"], "shaped": ev["shaped_reward"],
                     "d_success": [ds.mean, ds.low, ds.high], "d_shaped": [dh.mean, dh.low, dh.high]})
        if progress:
            print(
                f"{variant:>8} {group or 'all':>12} alpha {alpha:g}: success {ev['success_rate']:.3f} "
                f"({ds.mean:+.3f} [{ds.low:+.3f}, {ds.high:+.3f}]) | {time.perf_counter() - t0:.0f}s",
                flush=True,
            )
    place(None, 0.0, None)
    return {"setup": {**asdict(setup), "sigma": es.config.sigma}, "config": config.model_dump(mode="json"),
            "members": len(members),
            "rewards": rewards, "base": {"success": base["success_rate"], "shaped": base["shaped_reward"]},
            "eval_episodes": len(base["episode_success"]), "rows": rows, "seconds": time.perf_counter() - t0}


def report(result: dict) -> str:
    s, c, b = result["setup"], result["config"], result["base"]
    r = np.array(result["rewards"])
    lines = [
        "# One ES step, judged on held-out episodes", "",
        f"Config `{Path(s['config']).name}` {' '.join(s['overrides'])}; model {c['model']['name']}, "
        f"{c['env']['kwargs']}, T={c['sampling']['temperature']}. ES estimate: {s['pairs']} antithetic pairs "
        f"(G={result['members']}) x {s['tasks']} training tasks {'per pair' if s['pair_tasks'] else 'shared by all'}, "
        f"sigma {s['sigma']:g}, "
        f"{c['es']['shaping']} shaping of the `{c['es']['reward']}` reward (member rewards {r.mean():.3f} ± "
        f"{r.std():.3f}). Held-out: {result['eval_episodes']} episodes, base success {b['success']:.3f}, "
        f"shaped {b['shaped']:.3f}. Changes are paired bootstrap 95% intervals over the held-out tasks. "
        f"`permuted`: same coefficients, shuffled over the seeds (a random step of the same length). "
        f"{result['seconds']:.0f}s.", "",
        "| step | params | alpha | step norm | success | success change [95% CI] | shaped change [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        ds, dh = row["d_success"], row["d_shaped"]
        lines.append(f"| {row['variant']} | {row['group']} | {row['alpha']:g} | {row['step_norm']:.3f} | "
                     f"{row['success']:.3f} | {fmt_change(ds)} | {fmt_change(dh)} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    d = Setup()
    p = argparse.ArgumentParser(prog="esopt analyze step", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="training config whose model, env, sampling and eval are used (default: demo)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--pairs", type=int, help=f"antithetic pairs (default {d.pairs})")
    p.add_argument("--tasks", type=int, help=f"training tasks per member (default {d.tasks})")
    p.add_argument("--sigma", type=float, help="noise scale (default: the config's es.sigma)")
    p.add_argument("--alphas", nargs="+", type=float, help=f"step sizes (default {d.alphas})")
    p.add_argument("--groups", nargs="+", default=None, help="also the ES step restricted to these name regexes")
    p.add_argument("--pair-tasks", action="store_true", help="each antithetic pair gets its own training tasks")
    p.add_argument("--no-control", action="store_true", help="skip the permuted control")
    p.add_argument("--seed", type=int, help="seed of noise, tasks and the permutation (default 0)")
    add_analysis_options(p, "OUT/step_probe.md and .json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    setup = Setup(**SMOKE) if args.smoke else Setup()
    if args.config:
        setup.config = args.config
    setup.overrides = [*setup.overrides, *args.set]
    for key in ("pairs", "tasks", "sigma", "alphas", "groups", "seed"):
        if getattr(args, key) is not None:
            setattr(setup, key, getattr(args, key))
    setup.control = not args.no_control
    setup.pair_tasks = args.pair_tasks
    result = measure(setup, progress=not args.quiet)
    write_report(args.out, "step_probe", report(result), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
