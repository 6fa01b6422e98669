"""`esopt analyze gain`: did ES runs improve the model on held-out tasks, beyond what controls explain?

For ES run directories that share a config, every model is judged on the same held-out episodes (the
`--split`, default test: disjoint from training and from the validation split used for tuning), with the
same sampling seeds, paired with the base model:
- `base`: the run's starting weights, at the run's sampling settings;
- `base@T*`: the base at its best temperature, chosen on the validation split (`--temperatures`), so
  that sharpening or flattening the base's distribution alone is not counted as learning;
- `es`: each run's trained weights (rebuilt from the base and its ledger), with the run's final prompt
  (final/prompt.json) when it co-evolved one;
- `weights`, `prompt` (co-evolution runs whose prompt changed): each half alone, the trained weights with the
  starting prompt and the base weights with the final prompt;
- `random`: each run's ledger replayed with every generation's per-seed update coefficients shuffled
  over its seeds: a random walk with the same step sizes and noise, carrying no reward information.
Changes come with a paired bootstrap 95% interval over tasks and an exact McNemar test on success.
Evaluations are cached as JSON in OUT/gain_evals/, so parts can run in parallel processes and a rerun
only assembles the table.

    esopt analyze gain --runs runs/smol-s0 runs/smol-s1 runs/smol-s2 --episodes 1024 --out results
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from esopt.utils.report import add_analysis_options, fmt_change, write_report
from esopt.utils.stats import mcnemar_p


def permuted_records(records: list[dict], seed: int) -> list[dict]:
    """The ledger with each generation's per-seed coefficients shuffled over its seeds (same step lengths)."""
    from esopt.es import update_coefficients

    rng = np.random.default_rng([seed, 17])
    out = []
    for r in records:
        coefs = update_coefficients(r)
        seeds, values = list(coefs), list(coefs.values())
        values = [values[i] for i in rng.permutation(len(values))]
        out.append({**r, "seeds": seeds, "signs": [1] * len(seeds), "weights": values})
    return out


def _evaluate_cached(cache: Path, name: str, policy, config, make, progress: bool) -> dict:
    from esopt.train.evaluate import evaluate, rollout_spec

    path = cache / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    t = time.perf_counter()
    result = evaluate(policy, config, rollout_spec(config, make), make)
    result["name"] = name
    path.write_text(json.dumps(result))
    if progress:
        print(f"{name}: success {result['success_rate']:.3f} shaped {result['shaped_reward']:.3f} valid "
              f"{result['valid_action_rate']:.3f} correct|valid {result['correct_given_valid']:.3f} "
              f"({time.perf_counter() - t:.0f}s)", flush=True)
    return result


def coevolved_prompt(run: Path) -> str | None:
    """The final system prompt of a co-evolution run, or None when the run kept its starting prompt (or had none)."""
    final = run / "final" / "prompt.json"
    if not final.exists():
        return None
    system = json.loads(final.read_text())["system"]
    start = run / "prompts" / "v0000.json"
    if start.exists() and json.loads(start.read_text())["system"] == system:
        return None  # every candidate lost its gate: the run is a parameters-only run
    return system


def _step_norm(policy, base_state: dict[str, torch.Tensor]) -> float:
    sq = sum(float((p.detach().float() - base_state[n]).square().sum()) for n, p in policy.model.named_parameters())
    return sq**0.5


def best_of(result: dict, samples: int, tasks: int) -> dict:
    """Per task, the best of `samples` episodes as the env's verifier picks it (laid out sample-major)."""
    from esopt.testtime import by_task

    success = [max(g) for g in by_task(result["episode_success"], samples)]
    shaped = [max(g) for g in by_task(result["episode_shaped"], samples)]
    if len(success) != tasks:
        raise ValueError(f"{len(result['episode_success'])} episodes are not {samples} samples of {tasks} tasks")
    return {**result, "episode_success": success, "episode_shaped": shaped, "success_rate": sum(success) / tasks,
            "shaped_reward": sum(shaped) / tasks}


def _one_setting(runs: list[Path]):
    """The runs' common config (they must share model, env and sampling to be compared)."""
    from esopt.train.config import load_config

    if not runs:
        raise ValueError("--runs needs at least one ES run directory")
    configs = [load_config(r / "config.yaml") for r in runs]

    def setting(c):
        return c.model, c.env.kwargs, c.env.few_shot, c.sampling

    if bad := [r for r, c in zip(runs, configs) if setting(c) != setting(configs[0])]:
        raise ValueError(f"{bad[0]}: model, env or sampling differ from {runs[0]}; compare runs of one setting")
    return configs[0]


def measure(runs: list[Path], split: str, episodes: int, temperatures: list[float], validation_episodes: int,
            controls: bool, out: Path, progress: bool = True, es_runs: bool = True, best_of_n: int = 0,
            best_of_temperature: float = 0.7, samples: int = 0, parts: bool = True) -> dict:
    from esopt.es import read_history, replay
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory

    base_config = _one_setting(runs)
    cache = out / "gain_evals"
    cache.mkdir(parents=True, exist_ok=True)
    test = base_config.model_copy(deep=True)
    test.eval.split, test.eval.tasks, test.eval.repeats = split, episodes, 1
    make = env_factory(test)
    policy = load_model(test.model, test.env.kwargs)
    base_state = {n: p.detach().float().clone() for n, p in policy.model.named_parameters()}

    evals = {"base": _evaluate_cached(cache, f"base-{split}", policy, test, make, progress)}
    best_t, val_scores = None, {}
    if temperatures:
        val = test.model_copy(deep=True)
        val.eval.split, val.eval.tasks = "validation", validation_episodes
        for t in temperatures:
            val.sampling.temperature = t
            ev = _evaluate_cached(cache, f"base-validation-T{t:g}", policy, val, make, progress)
            val_scores[t] = (ev["success_rate"], ev["shaped_reward"])
        best_t = max(val_scores, key=lambda t: val_scores[t])
        tuned = test.model_copy(deep=True)
        tuned.sampling.temperature = best_t
        evals["base@T*"] = _evaluate_cached(cache, f"base-{split}-T{best_t:g}", policy, tuned, make, progress)

    if best_of_n > 1:  # test-time compute on the base: N sampled episodes per task, the verifier keeps the best
        sampled = test.model_copy(deep=True)
        sampled.sampling.temperature, sampled.eval.repeats = best_of_temperature, best_of_n
        ev = _evaluate_cached(cache, f"base-{split}-T{best_of_temperature:g}-x{best_of_n}", policy, sampled, make,
                              progress)
        evals[f"base best-of-{best_of_n}"] = best_of(ev, best_of_n, episodes)

    sampled_config = None
    sampled: dict[str, dict] = {}
    if samples > 1:  # Mean@k and Pass@k: k sampled episodes per task for the base and every ES run
        sampled_config = test.model_copy(deep=True)
        sampled_config.sampling.temperature, sampled_config.eval.repeats = best_of_temperature, samples
        sampled["base"] = _evaluate_cached(cache, f"base-{split}-T{best_of_temperature:g}-x{samples}", policy,
                                           sampled_config, make, progress)
    norms = {}
    for run in runs:
        records = read_history(run / "history.jsonl")
        variants = ([("es", records)] if es_runs else []) + (
            [("random", permuted_records(records, 0))] if controls else [])
        run_config = test
        final_prompt = coevolved_prompt(run)
        if final_prompt is not None:  # a co-evolution run: its weights are judged with its final prompt
            run_config = test.model_copy(deep=True)
            run_config.env.system_prompt = final_prompt
            if es_runs and parts:  # which half did it: each half alone, the other at its start
                variants += [("weights", records, test), ("prompt", [], run_config)]
        for kind, recs, *config in variants:
            name = f"{kind}-{run.name}"
            with torch.no_grad():
                for n, p in policy.model.named_parameters():
                    p.copy_(base_state[n])
                replay(policy.model, recs)
            norms[name] = _step_norm(policy, base_state)
            evals[name] = _evaluate_cached(cache, f"{name}-{split}", policy, config[0] if config else run_config,
                                           make, progress)
            evals[name]["generations"] = len(recs)
            if sampled_config is not None and kind == "es":
                sampled_run = sampled_config.model_copy(deep=True)
                sampled_run.env.system_prompt = run_config.env.system_prompt
                sampled[name] = _evaluate_cached(cache, f"{name}-{split}-T{best_of_temperature:g}-x{samples}", policy,
                                                 sampled_run, make, progress)
    return {"runs": [str(r) for r in runs], "split": split, "episodes": episodes,
            "config": test.model_dump(mode="json"), "best_temperature": best_t,
            "validation": {str(k): v for k, v in val_scores.items()}, "validation_episodes": validation_episodes,
            "evals": evals, "norms": norms, "samples": samples, "sample_temperature": best_of_temperature,
            "sampled": sampled}


def sampled_rows(result: dict) -> list[dict]:
    """Mean@k and Pass@k (k = all samples of a task) per model, each paired with the base over tasks."""
    from esopt.utils.stats import paired_difference

    sampled, k, n = result.get("sampled") or {}, result.get("samples", 0), result["episodes"]
    if "base" not in sampled:
        return []
    base, base_pass = sampled["base"], best_of(sampled["base"], k, n)
    out = []
    for name, ev in sampled.items():
        passed = best_of(ev, k, n)
        out.append({"name": name, "mean_at_k": ev["success_rate"], "pass_at_k": passed["success_rate"],
                    "d_mean": list(paired_difference(base["episode_success"], ev["episode_success"], n)[:3]),
                    "d_pass": list(paired_difference(base_pass["episode_success"], passed["episode_success"], n)[:3]),
                    "shaped_mean": ev["shaped_reward"],
                    "d_shaped_mean": list(paired_difference(base["episode_shaped"], ev["episode_shaped"], n)[:3])})
    return out


def rows(result: dict) -> list[dict]:
    from esopt.utils.stats import paired_difference

    evals, n = result["evals"], result["episodes"]
    base = evals["base"]
    out = []
    for name, ev in evals.items():
        ds = paired_difference(base["episode_success"], ev["episode_success"], n)
        dh = paired_difference(base["episode_shaped"], ev["episode_shaped"], n)
        out.append({"name": name, "success": ev["success_rate"], "d_success": list(ds[:3]),
                    "mcnemar_p": mcnemar_p(base["episode_success"], ev["episode_success"]),
                    "shaped": ev["shaped_reward"], "d_shaped": list(dh[:3]), "valid": ev["valid_action_rate"],
                    "correct_given_valid": ev["correct_given_valid"], "step_norm": result["norms"].get(name),
                    "generations": ev.get("generations")})
        control = evals.get("random-" + name.removeprefix("es-")) if name.startswith("es-") else None
        if control is not None:  # ES against the random walk of the same run, paired
            vs = paired_difference(control["episode_success"], ev["episode_success"], n)
            vh = paired_difference(control["episode_shaped"], ev["episode_shaped"], n)
            out[-1]["vs_random"] = {"d_success": list(vs[:3]), "d_shaped": list(vh[:3]),
                                    "mcnemar_p": mcnemar_p(control["episode_success"], ev["episode_success"])}
    return out


def group_rows(result: dict, key: str) -> list[dict]:
    """Success per kind of task (`key` of the env's last info, e.g. MiniWoB's `task`, Web-v0's `eval_types`):
    each model against the base on that group's episodes, paired, with a bootstrap interval over its tasks."""
    from esopt.utils.stats import paired_difference

    evals, n = result["evals"], result["episodes"]
    base = evals["base"]
    labels = (base.get("episode_labels") or {}).get(key)
    if labels is None:
        known = sorted(base.get("episode_labels") or {})
        raise ValueError(f"--by {key}: the env's infos carry no {key!r} label (they carry: {known or 'none'})")
    out = []
    for group in sorted(set(labels)):
        idx = [i for i, label in enumerate(labels) if label == group]
        tasks = len({i % n for i in idx})
        row = {"group": group, "episodes": len(idx), "models": {}}
        for name, ev in evals.items():
            before = [base["episode_success"][i] for i in idx]
            after = [ev["episode_success"][i] for i in idx]
            d = paired_difference(before, after, tasks) if len(idx) % tasks == 0 else None
            row["models"][name] = {"success": sum(after) / len(idx), "d_success": list(d[:3]) if d else None}
        out.append(row)
    return out


def report(result: dict) -> str:
    c = result["config"]
    lines = [
        f"Held-out `{result['split']}` split: {result['episodes']} episodes (one per task), the same tasks and "
        f"sampling seeds for every model; model {c['model']['name']}, env {c['env']['kwargs']}, few-shot "
        f"{c['env']['few_shot']}, T={c['sampling']['temperature']}. Changes are against `base`: paired bootstrap "
        "95% interval over tasks; p: exact McNemar test on success.", "",
        "| model | generations | step norm | success | success change [95% CI] | McNemar p | shaped | shaped change "
        "[95% CI] | valid actions | correct given valid |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(result):
        ds, dh = r["d_success"], r["d_shaped"]
        norm = f"{r['step_norm']:.2f}" if r["step_norm"] is not None else "-"
        name = r["name"] if r["name"] != "base@T*" else f"base@T*={result['best_temperature']:g}"
        lines.append(f"| {name} | {r['generations'] or '-'} | {norm} | {r['success']:.3f} | {fmt_change(ds)} | "
                     f"{r['mcnemar_p']:.3g} | {r['shaped']:.3f} | {fmt_change(dh)} | {r['valid']:.3f} | "
                     f"{r['correct_given_valid']:.3f} |")
    versus = [r for r in rows(result) if r.get("vs_random")]
    if versus:
        lines += ["", "ES against its own random-walk control (paired on the same episodes; the walk has the same "
                  "generations, seeds and step lengths with the coefficients shuffled):", "",
                  "| run | success change vs random [95% CI] | McNemar p | shaped change vs random [95% CI] |",
                  "|---|---|---|---|"]
        for r in versus:
            v = r["vs_random"]
            lines.append(f"| {r['name']} | {fmt_change(v['d_success'])} | {v['mcnemar_p']:.3g} | "
                         f"{fmt_change(v['d_shaped'])} |")
    if result.get("sampled"):
        k, temp = result["samples"], result["sample_temperature"]
        lines += ["", f"Test-time sampling: {k} episodes per task at T={temp:g}, the same tasks and sampling seeds for "
                  f"every model. Mean@{k}: success over all samples; Pass@{k}: a task counts if any sample succeeds "
                  "(the env's verifier as best-of-k). Changes against the base: paired bootstrap 95% interval over "
                  "tasks.", "",
                  f"| model | Mean@{k} | change [95% CI] | Pass@{k} | change [95% CI] | shaped Mean@{k} "
                  "| change [95% CI] |",
                  "|---|---|---|---|---|---|---|"]
        for r in sampled_rows(result):
            lines.append(f"| {r['name']} | {r['mean_at_k']:.3f} | {fmt_change(r['d_mean'])} | {r['pass_at_k']:.3f} | "
                         f"{fmt_change(r['d_pass'])} | {r['shaped_mean']:.3f} | {fmt_change(r['d_shaped_mean'])} |")
    if result.get("by"):
        groups = group_rows(result, result["by"])
        names = list(result["evals"])
        lines += ["", f"Success per `{result['by']}` (each model's change against the base on the same episodes, "
                  "paired bootstrap 95% interval over that group's tasks):", "",
                  "| " + result["by"] + " | episodes | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for g in groups:
            cells = []
            for name in names:
                m = g["models"][name]
                change = f" ({fmt_change(m['d_success'])})" if name != "base" and m["d_success"] else ""
                cells.append(f"{m['success']:.3f}{change}")
            lines.append(f"| {g['group']} | {g['episodes']} | " + " | ".join(cells) + " |")
    if result["validation"]:
        scores = ", ".join(f"T={t}: {s[0]:.3f}" for t, s in result["validation"].items())
        lines += ["", f"Base temperature chosen on {result['validation_episodes']} validation episodes (success): "
                  f"{scores}."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt analyze gain", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, type=Path, help="ES run directories of one config")
    p.add_argument("--split", choices=["test", "validation"], default="test")
    p.add_argument("--episodes", type=int, default=1024, help="held-out episodes (one per task)")
    p.add_argument("--temperatures", nargs="*", type=float, default=[0.0, 0.3, 0.7, 1.0],
                   help="base temperatures tried on the validation split (none: skip the control)")
    p.add_argument("--validation-episodes", type=int, default=512)
    p.add_argument("--no-controls", action="store_true", help="skip the random-step controls")
    p.add_argument("--controls-only", action="store_true",
                   help="evaluate only the base and the random-step controls (to run beside a --no-controls process)")
    p.add_argument("--no-parts", action="store_true", help="co-evolution runs: skip the two halves alone "
                   "(`weights-RUN`: trained weights, starting prompt; `prompt-RUN`: base weights, final prompt)")
    p.add_argument("--best-of", type=int, default=0, metavar="N",
                   help="also the base with test-time compute: best of N sampled episodes per task (env verifier)")
    p.add_argument("--best-of-temperature", type=float, default=0.7,
                   help="sampling temperature of --best-of and --samples")
    p.add_argument("--samples", type=int, default=0, metavar="K",
                   help="also Mean@K and Pass@K: K sampled episodes per task for the base and each ES run")
    p.add_argument("--by", metavar="KEY", help="also success per kind of task, from the env's last info: task "
                   "(MiniWoB), template, tier or eval_types (Web-v0)")
    add_analysis_options(p, "OUT/gain.md, OUT/gain.json and OUT/gain_evals/")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.episodes < 1 or args.validation_episodes < 1:
        raise ValueError("--episodes and --validation-episodes must be >= 1")
    missing = [str(r) for r in args.runs if not (r / "history.jsonl").exists()]
    if missing:
        raise FileNotFoundError(f"not an ES run directory (no history.jsonl): {missing[0]}")
    out = Path(args.out)
    result = measure(args.runs, args.split, args.episodes, [] if args.controls_only else args.temperatures,
                     args.validation_episodes, not args.no_controls, out, progress=not args.quiet,
                     es_runs=not args.controls_only, best_of_n=args.best_of,
                     best_of_temperature=args.best_of_temperature, samples=args.samples,
                     parts=not args.no_parts)
    result["by"] = args.by  # an unknown key fails in group_rows, before anything is written
    data = {**result, "rows": rows(result), "sampled_rows": sampled_rows(result),
            "group_rows": group_rows(result, args.by) if args.by else []}
    write_report(args.out, "gain", report(result), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
