"""`esopt analyze es-signal`: the noise-to-signal ratio of each ES variant's update direction, against the
dimension D its noise searches.

For each variant of `esopt bench es-variants` (its exact training config), R independent generations are
drawn from the unchanged model: fresh member seeds, fresh tasks and sampling seeds each, every member scored
as in training, shaped as in training (z-score, ranks, per-task z-score). Each gives the direction the
variant would step along, u = 1/G sum_i w_i eps_i. Over the R directions: trace of their covariance
(noise), |E u|^2 estimated without its noise bias (|mean|^2 - trace/R: the signal, 0 when not resolved), and
nsr = trace / |E u|^2, scale-free, so it compares across sigma, shaping and D. nsr x episodes per generation
is how many episodes it takes for the signal to reach the noise.

The signal estimate is the mean of the R(R-1) cross products u_i . u_j (i != j), so under noise that is close
to isotropic in the D searched dimensions (Gaussian noise with weights nearly independent of it: ES's case)
its standard error is trace x sqrt(2 / (D R (R-1))). Where the signal is within 1.645 of those of zero it is
"not resolved", and the row gives the one-sided 95% lower bound nsr > trace / (signal+ + 1.645 se): with D
~1e8 and R = 16 that bound is ~1e5, with D ~1e5 ~3e3.
Adam's first step is a sign of the same u, so it has no row of its own.

    esopt analyze es-signal --variants baseline norms subspace-r1 --h-star 1 --repeats 16 --out /work/sig
    esopt analyze es-signal --smoke --out /tmp/sig                         # seconds (tests)
    esopt analyze es-signal --report-only --out /work/sig    # the table of every variant saved in OUT

Each finished variant is saved to OUT/es_signal/<variant>_h<H>.json, so a stopped run continues with the rest.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from esopt.utils.io import write_json_atomic
from esopt.utils.report import add_analysis_options, cpu_model, write_report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt analyze es-signal", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["baseline"], help="variants of `esopt bench es-variants`")
    p.add_argument("--h-star", type=int, default=1, help="horizon (default 1)")
    p.add_argument("--repeats", "-R", type=int, default=16, help="independent generations per variant (default 16)")
    p.add_argument("--directions", "-K", type=int, default=8, help="random projection directions (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-only", action="store_true", help="only the report, of the variants already saved")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for every variant, after its own")
    add_analysis_options(p, "OUT/es_signal.md and .json")
    return p


def variant_config(name: str, h_star: int, seed: int, smoke: bool, overrides: list[str]):
    from esopt.experiments.es_variants import variant_plans
    from esopt.experiments.horizon import run_config

    args = argparse.Namespace(only=[name], h_stars=[h_star], seeds=[seed], eval_tasks=256, smoke=smoke,
                              overrides=overrides)
    return run_config(variant_plans(args)[name], "es", h_star, seed)


def _same_key(saved: dict, key: dict) -> bool:
    """A saved measurement is reused when it was made with this config and these options; a config field added
    since (absent from the saved key) counts at its default, so a new option does not void old rows."""
    from esopt.train.config import build_config

    if {**saved, "config": None} != {**key, "config": None}:
        return False
    try:  # the loader every stored config.yaml goes through: defaults <- saved fields
        then = build_config(saved["config"])
    except ValueError:  # saved with a field that no longer exists or a value no longer valid
        return False
    return then.model_dump(mode="json") == key["config"]


def measure_variant(config, policy, repeats: int, directions: int, progress: bool = False) -> dict:
    """R generations' update directions of `config`'s ES on `policy` (never updated): the noise-to-signal row."""
    import torch

    from esopt.es import ES
    from esopt.es.perturbation import update_coefficients
    from esopt.es.shaping import ZeroVariancePopulation, pair_disagreement
    from esopt.experiments.variance import ProjectionStats, RandomDirections
    from esopt.train.es import generation_tasks, population_evaluator, population_fitness
    from esopt.train.evaluate import member_spec, rollout_spec
    from esopt.train.tasks import env_factory

    make_env = env_factory(config)
    es = ES(policy.model, config.es_config.model_copy(update={"alpha": 0.0}), on_weights_changed=policy.weights_changed)
    evaluator = population_evaluator(config, es, policy, make_env)
    spec = member_spec(rollout_spec(config, make_env), config)
    numel = es.perturbation.numel
    stats = ProjectionStats(numel, RandomDirections(numel, directions, config.seed))
    scores, disagree, t0 = [], [], time.perf_counter()
    try:
        for r in range(repeats):
            members = es.ask(r)  # generation r's seeds, tasks and rollout seed, as training would draw them
            rollout_seed = int(np.random.default_rng([config.seed, r, 3]).integers(2**31))
            results = evaluator.evaluate(members, es.config.sigma, generation_tasks(config, r), rollout_seed, spec)
            fitness = population_fitness(results, config)
            with warnings.catch_warnings():  # a tied population's zero direction is one of the R samples
                warnings.simplefilter("ignore", ZeroVariancePopulation)
                weights = es.shaper(fitness)
            record = {"seeds": [m.seed for m in members], "signs": [m.sign for m in members],
                      "weights": [float(w) for w in weights]}
            coefs = {s: c / len(members) for s, c in update_coefficients(record).items()}
            with torch.no_grad():
                u = torch.cat([t.reshape(-1).cpu() for t in es.perturbation.combine(coefs)]) if coefs else \
                    torch.zeros(numel)
            stats.add(u)
            scores += [r_.reward for r_ in results]
            if config.es.antithetic:
                disagree.append(pair_disagreement(fitness, [m.sign for m in members]))
            if progress:
                print(f"  repetition {r + 1}/{repeats} | {time.perf_counter() - t0:.0f}s", flush=True)
    finally:
        evaluator.close()
    row = stats.result()
    row.pop("sq_norms")
    e = config.es
    episodes = e.population_size * e.tasks_per_member
    return {**row, "dimension": es.perturbation.searched_dimension, "numel": numel, "episodes_per_generation": episodes,
            "episodes_for_signal": row["nsr"] * episodes, "score_std": float(np.std(scores)),
            "pair_disagreement": float(np.mean(disagree)) if disagree else math.nan,
            "seconds": time.perf_counter() - t0, "sigma": e.sigma}


def signal_resolution(row: dict) -> dict:
    """The signal's standard error under near-isotropic noise in the searched dimensions, whether the signal
    is resolved (above 1.645 of them), and the one-sided 95% lower bound on nsr (see the module doc)."""
    trace = row["trace_per_dim"] * row["numel"]
    r, dim = row["repeats"], row["dimension"]
    se = trace * math.sqrt(2.0 / (dim * r * (r - 1)))
    signal = max(row["signal_sq"], 0.0)
    return {"signal_se": se, "resolved": signal > 1.645 * se,
            "nsr_lower": trace / (signal + 1.645 * se) if se > 0 else math.inf}


def report(rows: dict[str, dict], h_star: int, repeats: int, argv: list[str]) -> str:
    from esopt.experiments.es_variants import VARIANTS

    def g(x: float) -> str:
        return "not resolved" if math.isinf(x) else f"{x:.3g}"

    lines = ["# ES update direction: noise-to-signal against the searched dimension", "",
             f"H*={h_star}, R={repeats} generations per variant from the unchanged model; nsr = trace(Cov u) / "
             "|E u|^2 (scale-free). 'not resolved': the signal estimate is within 1.645 standard errors of zero; "
             "the nsr column then gives the one-sided 95% lower bound (> x), and episodes for signal = noise "
             f"likewise (nsr x G x E). CPU: {cpu_model()}.", "",
             "| variant | what | G x E | sigma | D | trace/D | nsr | episodes for signal = noise | pairs differ"
             " | score std | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        res = signal_resolution(r)
        episodes = r["population"] * r["tasks_per_member"]
        if res["resolved"]:
            nsr, need = g(r["nsr"]), g(r["nsr"] * episodes)
        else:
            nsr, need = f"> {res['nsr_lower']:.2g} (not resolved)", f"> {res['nsr_lower'] * episodes:.2g}"
        lines.append(f"| {name} | {VARIANTS[name].what} | {r['population']} x {r['tasks_per_member']} | "
                     f"{r['sigma']:.3g} | {r['dimension']:.3g} | {r['trace_per_dim']:.3g} | {nsr} | {need} | "
                     f"{r['pair_disagreement']:.2f} | {r['score_std']:.3f} | {r['seconds']:.0f} |")
    lines += ["", f"Command: `esopt analyze es-signal {' '.join(argv)}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    import torch

    from esopt.experiments.es_variants import VARIANTS
    from esopt.train.models import load_model

    torch.set_num_threads(args.threads)
    if unknown := [v for v in args.variants if v not in VARIANTS]:
        raise ValueError(f"unknown variant(s) {unknown}; registered: {list(VARIANTS)}")
    if args.repeats < 2:
        raise ValueError(f"--repeats must be >= 2 to estimate a variance (got {args.repeats})")
    if args.smoke:
        args.repeats, args.directions = min(args.repeats, 3), min(args.directions, 4)
    saved = Path(args.out) / "es_signal"
    # the report also keeps the variants measured before under OUT with the same options (a run of one variant
    # used to drop the others' rows); only the requested ones are measured
    to_measure = set() if args.report_only else set(args.variants)
    names = [v for v in VARIANTS if v in args.variants or (saved / f"{v}_h{args.h_star}.json").exists()]
    configs = {v: variant_config(v, args.h_star, args.seed, args.smoke, args.overrides) for v in names}
    rows, policy = {}, None
    for name, config in configs.items():
        path = saved / f"{name}_h{args.h_star}.json"
        key = {"config": config.model_dump(mode="json"), "repeats": args.repeats, "directions": args.directions}
        if path.exists() and _same_key((old := json.loads(path.read_text()))["key"], key):
            rows[name] = old["row"]
            continue
        if name not in to_measure:
            continue
        if policy is None:  # every variant measures the same fixed model
            policy = load_model(config.model, config.env.kwargs)
        if not args.quiet:
            print(f"{name}: {args.repeats} generations", flush=True)
        row = measure_variant(config, policy, args.repeats, args.directions, progress=not args.quiet)
        rows[name] = {**row, "population": config.es.population_size, "tasks_per_member": config.es.tasks_per_member}
        write_json_atomic(path, {"key": key, "row": rows[name]})
    if not rows:
        raise ValueError(f"no saved variant under {saved} matches these options")
    write_report(args.out, "es_signal", report(rows, args.h_star, args.repeats, argv),
                 {"rows": rows, "h_star": args.h_star, "repeats": args.repeats, "cpu": cpu_model()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
