"""`esopt bench es-variants`: which ES settings raise validation success per episode at a fixed episode budget.

Every variant is the horizon bench's ES run (`esopt bench horizon --preset smollm2`: SmolLM2 on 4x4 Sudoku,
8 generations of 32 episodes) with a few registered config options changed, nothing else: the population
shape (G members x E tasks each), where the noise lives (all matrices, attention or MLP only, the last layers,
the norms, a rank-r LoRA-shaped subspace), sigma, shaping, per-task z-scoring, antithetic pairs, Adam. Each
is scored on the **validation** split (`eval.split=validation`), paired with the base model and with the
baseline variant on the same tasks and sampling seeds, so a winner is picked without touching the test split.

    esopt bench es-variants --list                                        # the registry
    esopt bench es-variants --h-stars 1 --seeds 0 --jobs 2 --out /work/effic
    esopt bench es-variants --only baseline norms --h-stars 2 --out /work/effic --resume
    esopt bench es-variants --report-only --out /work/effic               # OUT/es_variants.md
    esopt bench es-variants --smoke --out /tmp/v                          # seconds (tests)

Runs land in OUT/<variant>/horizon/es_h<H>_s<seed> (the horizon bench's layout, so `esopt bench horizon
--report-only --out OUT/<variant>` reads one too); every run of one H* shares one base eval. The report a run
writes covers every variant and H* already under OUT, not only the ones it ran.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from esopt.utils.io import write_text_atomic

# the horizon tables' ES (tuned on validation at H*=1), which every variant starts from
BASELINE = ["es.sigma=4e-3", "es.sigma_min=2e-3", "es.alpha=2e-3"]
COMMON = ["eval.split=validation"]


@dataclass(frozen=True)
class Variant:
    what: str
    overrides: list[str] = field(default_factory=list)  # on top of BASELINE
    population: int = 8  # G
    # E, tasks per member. 0: the baseline's 32 episodes per generation split over the G members. A G x E beyond
    # 32 episodes keeps the same episodes in all with fewer generations (baseline generations x 32 / (G x E))
    tasks: int = 0


def _scoped(pattern: str, sigma: float) -> list[str]:
    """Noise on the parameters whose names match `pattern`, sigma cosine to sigma/2, alpha = sigma/2 (the
    baseline's ratio)."""
    return ["es.scope=regex", f"es.scope_pattern={pattern}", f"es.sigma={sigma:g}", f"es.sigma_min={sigma / 2:g}",
            f"es.alpha={sigma / 2:g}"]


VARIANTS: dict[str, Variant] = {
    "baseline": Variant("dense noise on all parameters, z-score, antithetic pairs, SGD (the horizon tables' ES)"),
    "G16xE2": Variant("G=16 x E=2", population=16),
    "G32xE1": Variant("G=32 x E=1", population=32),
    "G64xE1": Variant("G=64 x E=1, 4 generations (the same 256 episodes)", population=64, tasks=1),
    "G128xE1": Variant("G=128 x E=1, 2 generations (the same 256 episodes)", population=128, tasks=1),
    # more tasks per member at a large G: a smoother fitness per member, bought with fewer generations
    "G32xE2": Variant("G=32 x E=2, 4 generations (the same 256 episodes)", population=32, tasks=2),
    "G32xE4": Variant("G=32 x E=4, 2 generations (the same 256 episodes)", population=32, tasks=4),
    "G64xE2": Variant("G=64 x E=2, 2 generations (the same 256 episodes)", population=64, tasks=2),
    "G64xE4": Variant("G=64 x E=4, 1 generation (the same 256 episodes)", population=64, tasks=4),
    "alpha-x2": Variant("alpha 4e-3 at the baseline's sigma", ["es.alpha=4e-3"]),
    "alpha-x4": Variant("alpha 8e-3 at the baseline's sigma: where does the step-size lever stop?", ["es.alpha=8e-3"]),
    # scoped sigmas: where `esopt analyze sensitivity` found the most antithetic pairs differing (H*=1,
    # results/es_efficiency.md); at the dense 4e-3 attention-, MLP- and last-4-only noise changes no completion
    "attention": Variant("noise on attention matrices only", _scoped(r"self_attn", 1.6e-2)),
    "mlp": Variant("noise on MLP matrices only", _scoped(r"mlp", 1.6e-2)),
    "last4": Variant("noise on the last 4 of 30 layers only", _scoped(r"layers\.(2[6-9])\.", 6.4e-2)),
    "norms": Variant("noise on the RMSNorm gains only", _scoped(r"norm", 3e-2)),
    "subspace-r1": Variant("LoRA-shaped subspace, rank 1 (A0 fixed, B searched)", ["es.noise=subspace"]),
    "subspace-r4": Variant("LoRA-shaped subspace, rank 4", ["es.noise=subspace", "es.noise_rank=4"]),
    "sigma-x2": Variant("sigma 8e-3 -> 4e-3, alpha 4e-3", ["es.sigma=8e-3", "es.sigma_min=4e-3", "es.alpha=4e-3"]),
    "centered-rank": Variant("centered ranks instead of z-scores", ["es.shaping=centered_rank"]),
    "task-zscore": Variant("each task z-scored across members before the mean", ["es.fitness=task_zscore"]),
    "no-antithetic": Variant("8 independent members, no mirrored pairs", ["es.antithetic=false"]),
    "adam": Variant("Adam on the ES gradient, lr 7e-4 (the SGD step's per-coordinate size)",
                    ["es.optimizer=adam", "es.alpha=7e-4"]),
    # members decode greedily (ES at Scale): sampling noise leaves the member scores, so a pair's difference is the
    # perturbation's alone; evals keep the run's T=0.3, the yardstick of every other variant
    "greedy": Variant("members decode greedily (es.temperature 0); evals keep the run's sampling",
                      ["es.temperature=0"]),
    "greedy-alpha-x2": Variant("greedy members at alpha 4e-3: do the two levers add up?",
                               ["es.temperature=0", "es.alpha=4e-3"]),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt bench es-variants", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", metavar="VARIANT", help="run these variants (default: all; see --list)")
    p.add_argument("--list", action="store_true", help="print the registry and exit")
    p.add_argument("--h-stars", nargs="+", type=int, default=[1], help="horizons (default 1)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="training seeds (default 0)")
    p.add_argument("--eval-tasks", type=int, default=256, help="validation tasks per eval (default 256)")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for every variant, after its own")
    p.add_argument("--smoke", action="store_true", help="the horizon bench's smoke preset (tiny model, seconds)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (2 cores: 2 x --threads 1)")
    p.add_argument("--out", default="results", help="OUT/<variant>/horizon/<run>, OUT/es_variants.md")
    p.add_argument("--resume", action="store_true", help="skip finished runs, continue partial ones")
    p.add_argument("--report-only", action="store_true", help="only rebuild OUT/es_variants.md from the runs")
    p.add_argument("--also", nargs="+", default=[], metavar="DIR",
                   help="more out dirs whose runs the report pools (other seeds' sessions): DIR/<variant>/...")
    return p


def variant_plans(args: argparse.Namespace) -> dict:
    """{variant: the horizon bench's Plan for it}, validated."""
    from esopt.experiments.horizon import PRESETS, Plan

    names = args.only or list(VARIANTS)
    if unknown := [n for n in names if n not in VARIANTS]:
        raise ValueError(f"unknown variant(s) {unknown}; registered: {list(VARIANTS)}")
    preset = dict(PRESETS["smoke" if args.smoke else "smollm2"])
    base = Plan(**{**preset, "methods": ["es"], "h_stars": args.h_stars, "seeds": args.seeds,
                   "measure_inference_peak": False, "isolate": not args.smoke,
                   "eval_tasks": preset["eval_tasks"] if args.smoke else args.eval_tasks})
    plans = {}
    for name in names:
        v = VARIANTS[name]
        shape = {"population": min(v.population, base.episodes_per_step)}
        if v.tasks:
            episodes, width = base.steps * base.episodes_per_step, v.population * v.tasks
            if episodes % width or episodes < width:
                raise ValueError(f"{name}: {episodes} episodes in all do not split into generations of "
                                 f"{v.population} members x {v.tasks} tasks")
            shape = {"population": v.population, "episodes_per_step": width, "steps": episodes // width,
                     "group_size": 1}
        plan = replace(base, **shape,
                       overrides=[*base.overrides, *COMMON, *BASELINE, *v.overrides, *args.overrides])
        plan.check()
        plans[name] = plan
    return plans


def report_args(args: argparse.Namespace, out: Path) -> argparse.Namespace:
    """What the report covers. `--report-only` reports what it is asked (`--only`, `--h-stars`); a run reports
    every variant and horizon already under OUT, so running a few variants does not drop the others' rows."""
    if args.report_only:
        return args
    import re

    runs = [run for run in out.glob("*/horizon/es_h*_s*") if run.parent.parent.name in VARIANTS]
    names = {run.parent.parent.name for run in runs} | set(args.only or VARIANTS)
    h_stars = {int(m.group(1)) for run in runs if (m := re.fullmatch(r"es_h(\d+)_s\d+", run.name))}
    return argparse.Namespace(**{**vars(args), "only": [n for n in VARIANTS if n in names],
                                 "h_stars": sorted(h_stars | set(args.h_stars))})


def run_variants(plans: dict, out: Path, resume: bool, threads: int, jobs: int) -> list[str]:
    from esopt.experiments.horizon import run_config, run_name
    from esopt.experiments.sweep import run_sweep

    configs = {}
    for name, plan in plans.items():
        for h in plan.h_stars:
            for s in plan.seeds:
                config = run_config(plan, "es", h, s)
                config.eval.base_cache = str(out / "base_evals")  # one base eval per H* for every variant
                configs[f"{name}/horizon/{run_name('es', h, s)}"] = config
    if not next(iter(plans.values())).isolate:  # the smoke preset's tiny model: warm start once, here
        from esopt.train.sft import warm_start_path

        plan = next(iter(plans.values()))
        warm_start_path(plan.size, plan.warm_start_steps)
    return run_sweep(configs, out, resume=resume, isolate=next(iter(plans.values())).isolate, threads=threads,
                     jobs=jobs)


def searched_dimension(config) -> int:
    """D of a run's noise over its model (loads the model once per distinct scope and noise)."""
    from esopt.es.perturbation import build_perturbation
    from esopt.es.scope import select_parameters

    model = _model(config)
    params = select_parameters(model, config.es.param_scope)
    return build_perturbation(params, config.es_config.noise_spec(), restore="subtract").searched_dimension


_MODELS: dict = {}


def _model(config):
    key = config.model.name
    if key not in _MODELS:
        from esopt.train.models import load_model

        _MODELS[key] = load_model(config.model, config.env.kwargs).model
    return _MODELS[key]


def report(plans: dict, out: Path, also: Sequence[Path] = ()) -> str:
    """The table of every variant's finished runs under OUT, then under each of `also` (a run found in
    several roots is taken from the first)."""
    from esopt.experiments.horizon import load_results
    from esopt.train.config import load_config
    from esopt.utils.report import cpu_model, fmt_change
    from esopt.utils.stats import mcnemar_p, paired_difference

    lines = ["# ES variants: validation success per episode at a fixed budget", "",
             "Validation split, paired with the base and with `baseline` on the same tasks and sampling seeds "
             "(bootstrap 95% over tasks, seeds pooled; McNemar p against `baseline`). pairs differ: mean share "
             "of antithetic pairs whose two members scored differently over the run's generations. "
             f"CPU: {cpu_model()}.", ""]
    h_stars = sorted({h for p in plans.values() for h in p.h_stars})

    def roots(name: str) -> list[Path]:
        return [out / name, *(Path(a) / name for a in also)]

    for h in h_stars:
        lines += [f"## H* = {h}", "",
                  "| variant | what | seeds | G x E | D | success: base -> after | vs base [95%] | vs baseline [95%] | "
                  "McNemar p vs baseline | valid moves | correct given valid | pairs differ | s / gen |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        found = {}
        for name, plan in plans.items():
            runs: list = [r for r in load_results(replace(plan, h_stars=[h]), roots(name))
                          if r.summary.get("eval_after")]
            if runs:
                found[name] = sorted(runs, key=lambda r: r.seed)
        ref = found.get("baseline")
        for name, runs in found.items():
            plan = plans[name]
            base = [x for r in runs for x in r.summary["eval_before"]["episode_success"]]
            after = [x for r in runs for x in r.summary["eval_after"]["episode_success"]]
            tasks = plan.eval_tasks
            vs_ref, p_ref = "", ""
            common = sorted({r.seed for r in ref or []} & {r.seed for r in runs})
            if ref and name != "baseline" and common:  # paired on the seeds both have
                theirs = [x for r in ref if r.seed in common for x in r.summary["eval_after"]["episode_success"]]
                mine = [x for r in runs if r.seed in common for x in r.summary["eval_after"]["episode_success"]]
                vs_ref = fmt_change(paired_difference(theirs, mine, tasks))
                p_ref = f"{mcnemar_p(theirs, mine):.3g}" + ("" if len(common) == len(runs) == len(ref)
                                                             else f" (seeds {','.join(map(str, common))})")
            run = f"horizon/es_h{h}_s{runs[0].seed}"
            # the root load_results took the run from: the first with a finished run (summary.json)
            config = load_config(next(r / run / "config.yaml" for r in roots(name)
                                      if (r / run / "summary.json").exists()))
            ev = [r.summary["eval_after"] for r in runs]
            pairs = [row["pair_disagreement"] for r in runs for row in r.train_rows if "pair_disagreement" in row]
            secs = [row["seconds"] for r in runs for row in r.train_rows]
            lines.append(
                f"| {name} | {VARIANTS[name].what} | {','.join(str(r.seed) for r in runs)} | "
                f"{config.es.population_size} x {config.es.tasks_per_member} | "
                f"{searched_dimension(config):.3g} | {_mean(base):.3f} -> {_mean(after):.3f} | "
                f"{fmt_change(paired_difference(base, after, tasks))} | {vs_ref} | {p_ref} | "
                f"{_mean([e['valid_action_rate'] for e in ev]):.3f}"
                f" | {_mean([e['correct_given_valid'] for e in ev]):.3f}"
                f" | {_mean(pairs):.2f} | {_mean(secs):.0f} |")
        lines.append("")
    return "\n".join(lines)


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for name, v in VARIANTS.items():
            print(f"{name:14s} G={v.population:<3d} {v.what}: {' '.join(v.overrides) or '(baseline settings)'}")
        return 0
    import torch

    torch.set_num_threads(args.threads)
    plans = variant_plans(args)
    out = Path(args.out)
    t = time.perf_counter()
    failed = [] if args.report_only else run_variants(plans, out, args.resume, args.threads, args.jobs)
    text = report(variant_plans(report_args(args, out)), out, [Path(a) for a in args.also])
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "es_variants.md", text)  # a killed run leaves the old report whole
    print(text)
    print(f"wrote {out / 'es_variants.md'} ({time.perf_counter() - t:.0f}s)")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
