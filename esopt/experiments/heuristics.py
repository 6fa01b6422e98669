"""Test-time heuristic design: EoH (or independent sampling) with the LLM frozen, frozen at its best
temperature, perturbed without updates (noise only) and tuned by ES, at matched budgets, decoding and seeds.

    esopt bench heuristics --smoke --model scripted              # seconds: the pipeline end to end
    esopt bench heuristics --settings binpacking-weibull:L0:eoh,tsp:L1:eoh --seeds 5 --budget 48

A setting is problem:level:scaffold (at the --budget); each of its test sizes is one row. Every arm runs the
same seeds; `frozen_best_t` first tunes the temperature on the validation set (one frozen run per
temperature on a tuning seed outside the evaluation seeds), then runs at the best one. Per run the reported
number is the test objective of the heuristic the search picked (best validation objective in its final
population); the table shows its mean +- standard error over seeds, the paired difference ES - frozen and
ES - noise (t-test over seeds), and the paper-style count of rows improved / tied (within one standard error
of the paired difference) / worse. Test sizes of one setting share heuristics, so its rows are not
independent (as in the paper's 36 comparisons). Run dirs are resumable: a rerun skips finished runs.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np

from esopt.search import HeuristicSearch, SearchConfig, baseline_scores
from esopt.utils.report import cpu_model, write_report

ARMS = ("frozen", "frozen_best_t", "noise", "es")
SMOKE_SIZES = {
    "binpacking-weibull": {"train_size": 60, "train_count": 2, "val_count": 2, "test_sizes": [60],
                           "test_count": 2},
    "binpacking-or": {"train_size": 40, "train_count": 2, "val_count": 2, "test_sizes": [40], "test_count": 2},
    "tsp": {"train_size": 10, "train_count": 2, "val_count": 2, "test_sizes": [8, 10], "test_count": 2},
}
SCRIPTED = {"L0": ["1.5 a=2 t=6", "p=0.8 a=1 t=3", "no numbers", "2 0.5 9"],
            "L1": ["-r", "-r + 3*(r < 4)", "np.load(1)", "d_cur - 0.3*d_mean", "d_cur", "(("],
            "L2": ["    return -(bins - item)\n```"]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt bench heuristics", description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="binpacking-weibull:L0:eoh,tsp:L1:eoh",
                   help="comma-separated problem:level:scaffold (levels L0 L1 L2; scaffolds eoh sampling)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    p.add_argument("--seeds", type=int, default=5, help="evaluation seeds per arm (0..N-1)")
    p.add_argument("--budget", type=int, default=48, help="proposals per run, invalid ones included")
    p.add_argument("--population", type=int, default=4, help="EoH population size")
    p.add_argument("--batch-size", type=int, default=4, help="proposals per operator batch (= ES members)")
    p.add_argument("--temperature", type=float, default=1.0, help="decoding temperature of all arms but best_t")
    p.add_argument("--temperatures", default="0.6,1.0,1.4", help="frozen_best_t's grid, tuned on validation")
    p.add_argument("--tune-seed", type=int, default=1000, help="seed of the tuning runs (not an eval seed)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: 16 for L0, 24 for L1, 160 for L2")
    p.add_argument("--sigma", type=float, default=1e-3)
    p.add_argument("--alpha", type=float, default=5e-4)
    p.add_argument("--noise", default="lowrank", help="lowrank (batched members) or normal (dense, one by one)")
    p.add_argument("--model", default="smollm2", help="smollm2, tiny, scripted or a local model dir")
    p.add_argument("--run-dir", default="runs/heuristics", help="one resumable run dir per (setting, arm, seed)")
    p.add_argument("--out", default="results", help="writes OUT/heuristics.md and .json")
    p.add_argument("--smoke", action="store_true", help="tiny instances, budget 8, 2 seeds (seconds)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--sigma-probe", default="", help="only measure, for these comma-separated sigmas, how many "
                   "m1 completions of perturbed members differ from the base model's (same sampling seed)")
    return p


def sigma_probe(args, setting: tuple[str, str, str], sigmas: list[float], engine, prompts_per_seed: int = 8,
                seeds: int = 4) -> str:
    """Share of completions a perturbed member writes differently from the base model, with the same prompt
    and sampling seed: whether noise of this size changes what the model writes at all."""
    from esopt.envs.heuristics import get_problem
    from esopt.es import ES, ESConfig
    from esopt.es.batched import BatchedLowRank
    from esopt.search import levels
    from esopt.search.config import SearchConfig

    problem = get_problem(setting[0])
    seed_text = levels.seeds(setting[1], problem)[0][1].text
    messages, prefill = levels.prompt(setting[1], problem, "m1", [levels.Parent(seed_text, 5.0)])
    prompts = [engine.build_prompt(messages) + prefill] * prompts_per_seed
    sampling = SearchConfig(level=setting[1], max_new_tokens={"L0": 16, "L1": 24, "L2": 160}[setting[1]],
                            temperature=args.temperature).model_dump()
    from esopt.engines.base import SamplingParams

    sp = SamplingParams(temperature=sampling["temperature"], top_p=sampling["top_p"], top_k=sampling["top_k"],
                        max_new_tokens=sampling["max_new_tokens"])
    rows = ["| sigma | completions differing from the base model's |", "|---:|---:|"]
    for sigma in sigmas:
        es = ES(engine.model, ESConfig(population_size=prompts_per_seed, sigma=sigma, sigma_min=0.0,
                                       total_generations=1, noise="lowrank", noise_rank=1))
        host, differ = BatchedLowRank(engine.model, es.perturbation), 0
        for s in range(seeds):
            base = [x.text for x in engine.generate(prompts, sp, seed=s)]
            members = es.ask(s)
            with host.members(members, sigma), engine.route_members(host):
                out = [x.text for x in engine.generate(prompts, sp, seed=s, members=list(range(len(members))))]
            differ += sum(a != b for a, b in zip(base, out))
        rows.append(f"| {sigma:g} | {differ}/{seeds * prompts_per_seed} |")
    return "\n".join(rows)


def parse_settings(text: str) -> list[tuple[str, str, str]]:
    from esopt.envs.heuristics import PROBLEMS

    out = []
    for item in [x for x in text.split(",") if x]:
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in PROBLEMS or parts[1] not in ("L0", "L1", "L2") \
                or parts[2] not in ("eoh", "sampling"):
            raise ValueError(f"bad setting {item!r}: use problem:level:scaffold with problem in {sorted(PROBLEMS)}, "
                             "level L0/L1/L2, scaffold eoh/sampling")
        out.append((parts[0], parts[1], parts[2]))
    if not out:
        raise ValueError("--settings is empty")
    return out


def load_engine(name: str, level: str):
    if name == "scripted":
        from esopt.search import ScriptedEngine

        return ScriptedEngine(SCRIPTED[level], mode="hashed")
    from esopt.models import load_policy

    return load_policy(name)


def run_one(engine, base: dict | None, config: SearchConfig, out: Path, progress: bool) -> dict:
    """One resumable search from the base weights (restored first: the ES arm changes them)."""
    if base is not None:
        engine.model.load_state_dict(base)
        engine.weights_changed()
    return HeuristicSearch(config, engine, out, progress=progress).run(resume=True)


def tune_temperature(engine, base, make: dict, temps: list[float], tune_seed: int, root: Path, progress: bool
                     ) -> tuple[float, dict[str, float], list[dict]]:
    """The grid temperature whose frozen run's pick scores best on validation (ties: the lower)."""
    scores, runs = {}, []
    for t in temps:
        s = run_one(engine, base, SearchConfig(**{**make, "arm": "frozen", "temperature": t, "seed": tune_seed}),
                    root / f"tune_T{t:g}", progress)
        scores[f"{t:g}"] = s["pick_val"]
        runs.append(s)
    best = min(temps, key=lambda t: (scores[f"{t:g}"], t))
    return best, scores, runs


def run_setting(args, setting: tuple[str, str, str], arms: list[str], engine, base) -> dict:
    problem, level, scaffold = setting
    name = ":".join(setting)
    sizes = SMOKE_SIZES[problem] if args.smoke else {}
    make = dict(problem=problem, sizes=sizes, level=level, scaffold=scaffold, budget=args.budget,
                population_size=args.population, batch_size=args.batch_size, temperature=args.temperature,
                max_new_tokens=args.max_new_tokens or {"L0": 16, "L1": 24, "L2": 160}[level], sigma=args.sigma,
                alpha=args.alpha, noise=args.noise)
    root = Path(args.run_dir) / name.replace(":", "-")
    result: dict = {"setting": name, "baselines": baseline_scores(problem, sizes), "runs": {}, "tuning": None}
    for arm in arms:
        cfg, arm_name = dict(make), arm
        if arm == "frozen_best_t":
            temps = [float(x) for x in args.temperatures.split(",") if x]
            best, scores, tuning_runs = tune_temperature(engine, base, make, temps, args.tune_seed, root / arm,
                                                         not args.quiet)
            result["tuning"] = {"temperatures": scores, "best": best,
                                "seconds": sum(r["seconds"] for r in tuning_runs),
                                "valid": sum(r["valid"] for r in tuning_runs),
                                "proposals": sum(r["proposals"] for r in tuning_runs)}
            cfg.update(arm="frozen", temperature=best)
            if best == args.temperature and "frozen" in result["runs"]:  # the very same runs: not run twice
                result["runs"][arm_name] = result["runs"]["frozen"]
                result["tuning"]["same_as_frozen"] = True
                continue
        else:
            cfg["arm"] = arm
        result["runs"][arm_name] = [run_one(engine, base, SearchConfig(**{**cfg, "seed": s}),
                                            root / arm_name / f"seed{s}", not args.quiet)
                                    for s in range(args.seeds)]
    return result


def paired(a: list[float], b: list[float]) -> dict:
    """a - b over seeds (lower is better): mean, standard error, t-test p, and the verdict for a."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    keep = ~(np.isnan(a_) | np.isnan(b_))  # a seed where either pick failed on the test set is not a pair
    a, b = a_[keep], b_[keep]
    d = a - b
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    p = float("nan")
    if n > 1 and se > 0:
        from scipy import stats

        p = float(stats.ttest_rel(a, b).pvalue)
    mean = float(d.mean())
    if se == 0 or math.isnan(se):
        verdict = "tied" if mean == 0 else ("improved" if mean < 0 else "worse")
    else:
        verdict = "improved" if mean < -se else ("worse" if mean > se else "tied")
    return {"mean": mean, "se": se, "p": p, "verdict": verdict, "n": n}


def table(results: list[dict], arms: list[str]) -> tuple[str, dict]:
    head = "| setting | test set | baselines | " + " | ".join(arms) + " | ES - frozen | ES - noise |"
    rows = [head, "|---|---|---|" + "---:|" * len(arms) + "---:|---:|"]
    counts = {"vs_frozen": {"improved": 0, "tied": 0, "worse": 0}, "vs_noise": {"improved": 0, "tied": 0, "worse": 0}}
    for r in results:
        tests = sorted({k for runs in r["runs"].values() for s in runs for k in s["pick_test"]},
                       key=lambda k: int(k.split("@")[1]))
        for test in tests:
            base = ", ".join(f"{n} {v:.2f}" for n, v in r["baselines"][test].items())
            vals = {arm: [_num(s["pick_test"].get(test)) for s in r["runs"][arm]] for arm in arms if arm in r["runs"]}
            cells = [_mean_se(vals[a]) if a in vals else "-" for a in arms]
            diffs = []
            for other, key in (("frozen", "vs_frozen"), ("noise", "vs_noise")):
                if "es" in vals and other in vals:
                    d = paired(vals["es"], vals[other])
                    counts[key][d["verdict"]] += 1
                    diffs.append(f"{d['mean']:+.3f} ± {d['se']:.3f} (p {d['p']:.2f}, {d['verdict']})")
                else:
                    diffs.append("-")
            rows.append(f"| {r['setting']} | {test} | {base} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    return "\n".join(rows), counts


def _num(x) -> float:
    """A test objective; nan where the picked heuristic failed on the test set (shown, never hidden)."""
    return float("nan") if x is None else float(x)


def _mean_se(v: list[float]) -> str:
    a = np.asarray(v, dtype=float)
    bad = int(np.isnan(a).sum())
    a = a[~np.isnan(a)]
    if not a.size:
        return f"all {bad} invalid"
    se = a.std(ddof=1) / math.sqrt(len(a)) if len(a) > 1 else float("nan")
    return f"{a.mean():.3f} ± {se:.3f}" + (f" ({bad} invalid)" if bad else "")


def validity(results: list[dict]) -> str:
    rows = ["| setting | arm | proposals | valid | valid rate | parse failures | evaluation failures | "
            "mean s/run |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for arm, runs in r["runs"].items():
            n, v = sum(s["proposals"] for s in runs), sum(s["valid"] for s in runs)
            rows.append(f"| {r['setting']} | {arm} | {n} | {v} | {v / max(1, n):.1%} | "
                        f"{sum(s['invalid_parse'] for s in runs)} | {sum(s['invalid_evaluate'] for s in runs)} | "
                        f"{np.mean([s['seconds'] for s in runs]):.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.budget, args.seeds, args.population, args.batch_size = 8, 2, 3, 4
        args.temperatures = "0.7,1.0"
    settings = parse_settings(args.settings)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or any(a not in ARMS for a in arms):
        raise ValueError(f"--arms must be a comma-separated subset of {','.join(ARMS)}, got {args.arms!r}")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    import torch

    torch.set_num_threads(args.threads)
    if args.sigma_probe:
        engine = load_engine(args.model, settings[0][1])
        print(f"{':'.join(settings[0])}, model {args.model}, T = {args.temperature:g}, low-rank rank-1 noise")
        print(sigma_probe(args, settings[0], [float(x) for x in args.sigma_probe.split(",") if x], engine))
        return 0
    start, results, engines = time.perf_counter(), [], {}
    for setting in settings:
        key = args.model if args.model != "scripted" else f"scripted-{setting[1]}"
        if key not in engines:
            engine = load_engine(args.model, setting[1])
            base = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
            engines[key] = (engine, base)
        results.append(run_setting(args, setting, arms, *engines[key]))
    wall = time.perf_counter() - start
    text, counts = report(args, argv, results, arms, wall)
    write_report(args.out, "heuristics", text, {"results": results, "counts": counts, "wall_seconds": wall})
    return 0


def report(args, argv, results: list[dict], arms: list[str], wall: float) -> tuple[str, dict]:
    main_table, counts = table(results, arms)
    tuning = [f"- {r['setting']}: validation objective by temperature {r['tuning']['temperatures']}, best "
              f"T = {r['tuning']['best']:g} ({r['tuning']['proposals']} proposals, {r['tuning']['seconds']:.0f} s)"
              + ("; the same as frozen's T, so its runs are frozen's" if r["tuning"].get("same_as_frozen") else "")
              for r in results if r["tuning"]]
    lines = [
        "# Test-time heuristic design (generated by `esopt bench heuristics`)", "",
        f"Command: `esopt bench heuristics {' '.join(argv or [])}`", "",
        f"Model {args.model}; CPU: {cpu_model()}, {os.cpu_count()} logical CPUs, {args.threads} torch thread(s); "
        f"total wall-clock {wall / 60:.1f} min. Budget {args.budget} proposals per run (invalid included), "
        f"population {args.population}, batches of {args.batch_size}, {args.seeds} seeds per arm, T = "
        f"{args.temperature:g}, sigma {args.sigma:g} (cosine to 0), alpha {args.alpha:g}, noise {args.noise}.", "",
        "Numbers: test objective (lower is better: % over the L1 bound for bin packing, % over the reference "
        "tour for TSP) of the heuristic each run picked on validation; mean ± standard error over seeds. "
        "Differences are paired by seed.", "", main_table, "",
        f"ES vs frozen: improved {counts['vs_frozen']['improved']}, tied {counts['vs_frozen']['tied']}, worse "
        f"{counts['vs_frozen']['worse']}. ES vs noise only: improved {counts['vs_noise']['improved']}, tied "
        f"{counts['vs_noise']['tied']}, worse {counts['vs_noise']['worse']} (rows of one setting share "
        "heuristics: not independent).", "",
        "## Temperature tuning (frozen_best_t)", "", *(tuning or ["- not run"]), "",
        "## Valid proposals and wall-clock per run", "", validity(results), "",
    ]
    return "\n".join(lines), counts


if __name__ == "__main__":
    raise SystemExit(main())
