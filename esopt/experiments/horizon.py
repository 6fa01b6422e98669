"""`esopt bench horizon`: ES vs GRPO vs PPO on multi-turn Sudoku as the horizon H* grows (the shape of the
paper's Figure 3), from the same starting model with matched rollout budgets.

Every (method, H*, seed) is a normal `train()` into `OUT/horizon/<method>_h<H>_s<seed>/` (its own config,
metrics, plots, summary), by default in a fresh process each, so that each run's peak memory (VmHWM on
CPU) is its own. Then `OUT/horizon.md` and `OUT/horizon.png` compare them: final held-out success
(mean ± std over seeds, and the base model's), peak memory (and GRPO/ES, PPO/ES, ES/inference-only),
wall-clock and generated tokens per step, and eval curves (held-out success and shaped score vs step,
one subplot per H*).

Matched budget: every method rolls out the same number of episodes per step M (ES: population N x
tasks_per_member M/N; GRPO: tasks_per_step M/G x group_size G; PPO: tasks_per_step M) with the same
sampling (T=0.7, top-p 0.8, top-k 20, max_new_tokens 10: "set r c v" + EOS) and the same training score
(`--reward`, default the env's shaped score, see the note below; the paper trains on binary success;
the env reward itself stays binary, so the eval's mean reward is its success rate). The starting model
is `tiny-sudoku` (tiny Llama, ~1.05M parameters, warm-started 800 supervised steps on 4x4 solver demos;
built once and cached), and every run evaluates the same held-out tasks with the same sampling seed, so
step 0 of every run at one H* is the base model.

Hyper-parameters are `HPARAMS` (change any with `--set es.sigma=1e-2 grpo.lr=3e-5 ...`); how they were
calibrated and tuned, and the CPU budget per step, are in results/horizon.md.

    esopt bench horizon                            # the CPU default into results/
    esopt bench horizon --seeds 0 1 2 3 --resume   # add a seed, keep the finished runs
    esopt bench horizon --size 6 --h-stars 5 10 15 # 6x6 board (its own warm start, built once)
    esopt bench horizon --preset smoke --out /tmp/smoke
    esopt bench horizon --report-only --out ALL --runs-from CPU_OUT GPU_OUT  # one report of runs made elsewhere
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from esopt.engines.base import SamplingParams

METHODS = ("es", "grpo", "ppo")
BUDGETS = ("episodes", "flops")
LABELS = {"es": "ES", "grpo": "GRPO", "ppo": "PPO"}
PAPER = "paper (Qwen3.5-4B, 9x9, H* 5/10/15): PPO 90.63/56.25/0.00, GRPO 85.42/67.71/40.63, ES 89.58/62.50/53.13"

HPARAMS: dict[str, dict] = {
    "es": {"antithetic": True, "sigma": 3e-3, "sigma_min": 1e-3, "sigma_schedule": "cosine", "alpha": 1.5e-3,
           "shaping": "zscore"},
    "grpo": {"lr": 1e-5, "kl_beta": 1e-3, "clip_eps": 0.2, "epochs": 1, "minibatch_size": 256,
             "micro_batch_size": 64},
    "ppo": {"lr": 1e-5, "critic_lr": 1e-3, "kl_beta": 1e-3, "clip_eps": 0.2, "epochs": 2, "minibatch_size": 256,
            "micro_batch_size": 64, "gamma": 1.0, "lam": 0.95},
}


@dataclass
class Plan:
    """What to run: the grid (methods x H* x seeds) and everything the runs share."""

    h_stars: list[int]
    seeds: list[int]
    steps: int
    episodes_per_step: int  # M, the same for every method
    population: int  # ES members N (tasks per member M / N)
    group_size: int  # GRPO rollouts per task G (tasks per step M / G)
    eval_tasks: int
    eval_every: int
    warm_start_steps: int
    measure_inference_peak: bool
    isolate: bool  # one fresh process per run (honest per-run peak memory)
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    model: str = "tiny-sudoku"  # or "smollm2" (pretrained; bf16 compute, fp32 masters for GRPO/PPO)
    size: int = 4
    reward: str = "shaped"  # training score of every method: shaped | success | env
    max_new_tokens: int = 10
    temperature: float = SamplingParams.temperature
    overrides: list[str] = field(default_factory=list)  # `--set` dotted overrides
    curve_every: int = 0  # learning curve: validation success every k steps (0: off)
    curve_tasks: int = 32  # validation tasks per learning-curve eval
    # episodes: every method rolls out M episodes per step. flops: ES gets the episodes that cost what one GRPO
    # step's passes cost (Table 2's factors, `matched_flops_scale`): members x scale, the same tasks per member;
    # PPO the episodes that cost what ES's cost (`matched_episodes`)
    budget: str = "episodes"

    def check(self) -> None:
        m = self.episodes_per_step
        if bad := [x for x in self.methods if x not in METHODS]:
            raise ValueError(f"unknown method(s) {bad}; choose from {list(METHODS)}")
        if self.size not in (4, 6, 9):
            raise ValueError(f"--size must be 4, 6 or 9 (got {self.size})")
        if out_of_range := [h for h in self.h_stars if not 1 <= h <= self.size ** 2]:
            raise ValueError(f"--h-stars {out_of_range} out of range 1..{self.size ** 2} "
                             f"for a {self.size}x{self.size} board")
        if self.population % 2 or m % self.population:
            raise ValueError(f"--episodes-per-step ({m}) must be a multiple of the ES population ({self.population}), "
                             "which must be even (antithetic pairs)")
        if m % self.group_size:
            raise ValueError(f"--episodes-per-step ({m}) must be a multiple of the GRPO group size ({self.group_size})")
        if not (self.h_stars and self.seeds and self.methods):
            raise ValueError("need at least one method, one H* and one seed")
        if self.budget not in BUDGETS:
            raise ValueError(f"--budget must be one of {list(BUDGETS)} (got {self.budget!r})")


PRESETS: dict[str, dict] = {
    "cpu": dict(h_stars=[5, 10, 15], seeds=[0, 1, 2], steps=8, episodes_per_step=32, population=8, group_size=8,
                eval_tasks=32, eval_every=2, warm_start_steps=800, measure_inference_peak=True, isolate=True),
    "smoke": dict(h_stars=[1, 2], seeds=[0], steps=2, episodes_per_step=8, population=4, group_size=4,
                  eval_tasks=4, eval_every=0, warm_start_steps=60, measure_inference_peak=False, isolate=False,
                  curve_every=1, curve_tasks=2),
    # SmolLM2 on the setting calibrated in results/horizon_pretrained.md (validation split): 4x4 boards, each
    # empty cell listed with its candidate digits, two worked examples that each show a whole solved episode;
    # base success 0.36 / 0.23 / 0.00 at H* 1 / 2 / 4 (greedy). Sampling at T=0.3 for every method (GRPO's
    # groups need diverse rollouts), top-p 1, top-k 0. Sized for a multi-hour CPU run in the background.
    # fp32 on every CPU, so a table does not change with the CPU type (`auto` picks bf16 where the CPU has it);
    # evals in generate calls of at most 128 rows (512 rows of few-shot KV at once held 10 GB). The learning
    # curve: 32 validation tasks every 2 steps (the H* 1/2/4 tables ran before it existed, without).
    "smollm2": dict(h_stars=[1, 2, 4], seeds=[0, 1, 2], steps=8, episodes_per_step=32, population=8,
                    group_size=4, eval_tasks=512, eval_every=0, warm_start_steps=0, measure_inference_peak=True,
                    isolate=True, model="smollm2", temperature=0.3, curve_every=2,
                    overrides=["env.kwargs.hints=candidates", "env.kwargs.examples=episode", "env.few_shot=2",
                               "sampling.top_p=1.0", "sampling.top_k=0", "model.dtype=float32",
                               "max_batch_size=128"]),
}


# --- configs ---------------------------------------------------------------------------------------

def run_name(method: str, h_star: int, seed: int) -> str:
    return f"{method}_h{h_star}_s{seed}"


def pg_pass_factors(algo: str, section, reused: bool = False) -> tuple[float, float]:
    """Model FLOPs per token and parameter of one GRPO/PPO step's passes (Table 2's factors), as (policy, critic).
    The policy: the rollout's forward (2), forward and backward per epoch (6 each), forward for the old
    log-probs when samples are reused (2: several epochs or minibatches; PPO always), the frozen KL reference
    (2). PPO's critic reads every prompt for the old values (2) and trains on it (6 per epoch)."""
    ppo = algo == "ppo"
    reused = reused or ppo or section.epochs > 1
    policy = 2.0 + 6.0 * section.epochs + 2.0 * reused + (2.0 if section.kl_beta > 0 else 0.0)
    return policy, (2.0 + 6.0 * section.epochs if ppo else 0.0)


def matched_flops_scale(plan: Plan) -> int:
    """How many times GRPO's episodes ES rolls out per step at the plan's budget: 1 at equal episodes; at
    matched FLOPs GRPO's factor over ES's (2: the rollout's forward only), e.g. (2 + 6 + 2) / 2 = 5."""
    if plan.budget == "episodes":
        return 1
    grpo = run_config(replace(plan, budget="episodes"), "grpo", plan.h_stars[0], plan.seeds[0]).grpo
    return max(1, round(pg_pass_factors("grpo", grpo)[0] / 2.0))


def matched_episodes(plan: Plan, method: str) -> int:
    """Training episodes per step of `method` at the plan's budget. At matched FLOPs ES rolls out GRPO's
    episodes x `matched_flops_scale`, and PPO, whose step costs more than GRPO's (old log-probs always, a
    critic), gets the episodes whose passes cost what ES's rollouts cost: ES's episodes x 2 / PPO's factor,
    the critic counted on every token (it reads only prompts, ~97% of a Sudoku step's tokens)."""
    m = plan.episodes_per_step
    if plan.budget == "episodes" or method == "grpo":
        return m
    es = m * matched_flops_scale(plan)
    if method == "es":
        return es
    ppo = run_config(replace(plan, budget="episodes"), "ppo", plan.h_stars[0], plan.seeds[0]).ppo
    return max(1, round(2.0 * es / sum(pg_pass_factors("ppo", ppo))))


def run_config(plan: Plan, method: str, h_star: int, seed: int):
    """The full training config of one run (validated), with the plan's matched budget."""
    from esopt.train.config import build_config

    m, matched = plan.episodes_per_step, matched_episodes(plan, method)
    data = {
        "algo": method, "seed": seed, "steps": plan.steps,
        "model": {"name": plan.model, **({"warm_start_steps": plan.warm_start_steps}
                                          if plan.model == "tiny-sudoku" else {})},
        "env": {"id": "esopt/Sudoku-v0", "kwargs": {"size": plan.size, "h_star": h_star, "reward": "binary"}},
        "sampling": {"temperature": plan.temperature, "top_p": 0.8, "top_k": 20, "max_new_tokens": plan.max_new_tokens},
        "eval": {"every": plan.eval_every, "tasks": plan.eval_tasks, "repeats": 1, "curve_every": plan.curve_every,
                 "curve_tasks": plan.curve_tasks},
        "checkpoint_every": max(1, plan.steps // 2), "keep_checkpoints": 1,
        # the inference-only probe costs a process start: once per (method, H*) is enough
        "measure_inference_peak": plan.measure_inference_peak and seed == plan.seeds[0],
    }
    section = {**HPARAMS[method], "reward": plan.reward}
    if method == "es":
        section.update(population_size=plan.population * matched // m, tasks_per_member=m // plan.population)
    elif method == "grpo":
        section.update(tasks_per_step=m // plan.group_size, group_size=plan.group_size)
    else:
        section.update(tasks_per_step=matched)
    data[method] = section
    mine = [o for o in plan.overrides if o.split(".", 1)[0] not in METHODS or o.split(".", 1)[0] == method]
    config = build_config(data, mine)
    if config.episodes_per_step != matched:
        raise ValueError(f"--set {mine} gives {method} {config.episodes_per_step} episodes per step, not the "
                         f"matched {matched}: change --episodes-per-step, --population or --group-size instead")
    return config


# --- running ---------------------------------------------------------------------------------------

def run_all(plan: Plan, out: Path, resume: bool = False, threads: int = 1, progress: bool = False,
            jobs: int = 1) -> list[str]:
    """Train every (method, H*, seed) not finished yet, `jobs` at a time; returns the names of failed runs."""
    from esopt.experiments.sweep import run_sweep
    from esopt.train.sft import warm_start_path

    cells = [(m, h, s) for h in plan.h_stars for s in plan.seeds for m in plan.methods]
    configs = {run_name(*c): run_config(plan, *c) for c in cells}  # validate every config before any work
    for config in configs.values():  # every method and seed at one H* starts from one base: evaluate it once
        config.eval.base_cache = str(out / "horizon_base_evals")
    if plan.model == "tiny-sudoku":  # here, so no run's peak memory includes pretraining
        warm_start_path(plan.size, plan.warm_start_steps)
    return run_sweep(configs, out / "horizon", resume=resume, isolate=plan.isolate, threads=threads,
                     progress=progress, jobs=jobs)


# --- report ----------------------------------------------------------------------------------------

@dataclass
class RunResult:
    method: str
    h_star: int
    seed: int
    summary: dict
    evals: list[tuple[int, float, float]]  # (step, held-out success, held-out shaped score)
    train_rows: list[dict]
    episodes_per_step: int
    wall_seconds: float | None
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, validation success): eval.curve_every
    step_flops: list[float] = field(default_factory=list)  # estimated model FLOPs of each training step


def step_flops(config, row: dict, parameters: float) -> float:
    """Estimated model FLOPs of one training step from its token counts, with no credit for shared-prefix reuse
    (an upper estimate for every method alike): 2 per token and parameter for ES's rollout, `pg_pass_factors`
    for GRPO/PPO (the critic's on prompt tokens only). NaN when the row lacks the token counts."""
    prompt, generated = row.get("prompt_tokens", math.nan), row.get("generated_tokens", math.nan)
    if config.algo == "es":
        return 2.0 * parameters * (prompt + generated)
    section = getattr(config, config.algo)
    policy, critic = pg_pass_factors(config.algo, section, reused=row.get("samples", 0) > section.minibatch_size)
    return parameters * (policy * (prompt + generated) + critic * prompt)


def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def load_results(plan: Plan, roots: Sequence[Path]) -> list[RunResult]:
    """The finished runs of the plan's grid, each from the first root that has it (OUT/horizon/<run>)."""
    from esopt.train.config import load_config

    results = []
    for h in plan.h_stars:
        for s in plan.seeds:
            for m in plan.methods:
                found = [root / "horizon" / run_name(m, h, s) for root in roots]
                run = next((r for r in found if (r / "summary.json").exists()), None)
                if run is None:
                    continue
                rows = _rows(run / "metrics.jsonl")
                bench = json.loads((run / "bench.json").read_text()) if (run / "bench.json").exists() else {}
                config = load_config(run / "config.yaml")
                summary = json.loads((run / "summary.json").read_text())
                train = [r for r in rows if r["kind"] == "train"]
                results.append(RunResult(
                    m, h, s, summary,
                    sorted((r["step"], r["success_rate"], r.get("shaped_reward", math.nan))
                           for r in rows if r["kind"] == "eval"),
                    train, config.episodes_per_step, bench.get("wall_seconds"),
                    sorted((r["step"], r["success_rate"]) for r in rows if r["kind"] == "curve"),
                    [step_flops(config, r, summary.get("parameters", math.nan)) for r in train]))
    return results


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mu = _mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def _ratio(a: float, b: float) -> str:
    return "n/a" if not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def _episodes(runs: list[RunResult], which: str) -> dict[int, tuple[list[int], list[int]]]:
    """Per seed: the base's per-episode success and that of `which` eval ("eval_before"/"eval_after"). Every
    run at one H* evaluates the same tasks, and each seed the same sampling seeds, so episodes pair up."""
    return {r.seed: (r.summary["eval_before"]["episode_success"], r.summary[which]["episode_success"])
            for r in runs if r.summary.get(which) and r.summary.get("eval_before")}


def _pooled(by_seed: dict[int, tuple[list[int], list[int]]], seeds: list[int], which: int) -> list[int]:
    """The seeds' episodes concatenated in seed order (which: 0 the base, 1 the run)."""
    return [x for s in seeds for x in by_seed[s][which]]


def paired_lines(plan: Plan, results: list[RunResult]) -> list[str]:
    """Table 1's paired part: each method against the base and ES against each baseline, per H*, with a
    paired bootstrap 95% interval over held-out tasks (seeds pooled as repeats of the same tasks) and an exact
    McNemar p; plus the valid-move rate and correctness given a valid move, so a format-only gain shows."""
    from esopt.utils.report import fmt_change
    from esopt.utils.stats import mcnemar_p, paired_difference

    lines = ["", "## Paired with the base on the same held-out tasks and sampling seeds", "",
             "Change in success [paired bootstrap 95% over tasks, seeds pooled]; McNemar p on the pooled pairs; "
             "valid-move rate and correct-given-valid of the final eval (mean over seeds; base in brackets).", "",
             "| H* | method | episodes | success | change vs base | McNemar p | valid moves | correct given valid |",
             "|---|---|---|---|---|---|---|---|"]
    final: dict[tuple[str, int], dict[int, tuple[list[int], list[int]]]] = {}
    for h in plan.h_stars:
        for m in plan.methods:
            runs = [r for r in results if r.method == m and r.h_star == h and r.summary.get("eval_after")]
            by_seed = _episodes(runs, "eval_after")
            if not by_seed:
                continue
            final[(m, h)] = by_seed
            base, after = _pooled(by_seed, sorted(by_seed), 0), _pooled(by_seed, sorted(by_seed), 1)
            d = paired_difference(base, after, tasks=plan.eval_tasks)
            ev = [r.summary["eval_after"] for r in runs]
            b0 = runs[0].summary["eval_before"]
            lines.append(f"| {h} | {LABELS[m]} | {len(after)} | {_mean(after):.3f} (base {_mean(base):.3f}) | "
                         f"{fmt_change(d)} | {mcnemar_p(base, after):.3g} | "
                         f"{_mean([e['valid_action_rate'] for e in ev]):.3f} ({b0['valid_action_rate']:.3f}) | "
                         f"{_mean([e['correct_given_valid'] for e in ev]):.3f} ({b0['correct_given_valid']:.3f}) |")
    return lines + _duel_lines(plan, final)


def _duel_lines(plan: Plan, final: dict) -> list[str]:
    """ES against each baseline on the seeds both ran (the same tasks and sampling seeds pair up): a baseline
    with fewer seeds is still compared, on those seeds, and the line says which."""
    from esopt.utils.report import fmt_change
    from esopt.utils.stats import mcnemar_p, paired_difference

    lines = []
    for h in plan.h_stars:
        for other in ("grpo", "ppo"):
            if ("es", h) not in final or (other, h) not in final:
                continue
            seeds = sorted(set(final[("es", h)]) & set(final[(other, h)]))
            es, them = _pooled(final[("es", h)], seeds, 1), _pooled(final[(other, h)], seeds, 1)
            if not seeds or len(es) != len(them):
                continue
            label = f"ES vs {LABELS[other]}" + ("" if len(seeds) == len(plan.seeds) else
                                                 f" (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})")
            lines.append(f"| {h} | {label} | {fmt_change(paired_difference(them, es, plan.eval_tasks))}"
                         f" | {mcnemar_p(them, es):.3g} |")
    if lines:
        lines = ["", "ES against each baseline (same tasks, seeds matched):", "",
                 "| H* | comparison | ES - baseline [95%] | McNemar p |", "|---|---|---|---|", *lines]
    return lines


def time_lines(plan: Plan, by: dict, methods: list[str]) -> list[str]:
    """Table 2's time part: seconds, tokens and estimated model FLOPs per step, per H* and method."""
    lines = ["", "## Time and tokens per step (mean over seeds)", "",
             "| H* | method | s/step (training) | s/step (incl. evals) | generated tokens/step | prompt tokens/step "
             "| est. TFLOP/step | episodes/step | run wall-clock (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for h in plan.h_stars:
        for m in methods:
            rs = by[(m, h)]
            if not rs:
                continue
            sec = _mean([_mean([row["seconds"] for row in r.train_rows]) for r in rs])
            tok = _mean([_mean([row["generated_tokens"] for row in r.train_rows]) for r in rs])
            ptok = _mean([_mean([row.get("prompt_tokens", math.nan) for row in r.train_rows]) for r in rs])
            flop = _mean([_mean(r.step_flops) for r in rs])
            wall = [r.wall_seconds for r in rs if r.wall_seconds is not None]
            wall_s = f"{_mean(wall):.0f}" if wall else "n/a"
            eps = ", ".join(str(x) for x in sorted({r.episodes_per_step for r in rs}))
            lines.append(f"| {h} | {LABELS[m]} | {sec:.1f} | {_mean([r.summary['seconds_per_step'] for r in rs]):.1f}"
                         f" | {tok:.0f} | {ptok:.0f} | {flop / 1e12:.3g} | {eps} | {wall_s} |")
    return lines


def budget_text(plan: Plan) -> str:
    m, scale = plan.episodes_per_step, matched_flops_scale(plan)
    if scale == 1:
        return f"**{m} episodes per step for every method**"
    ppo = matched_episodes(plan, "ppo")
    return (f"**matched estimated model FLOPs per step**: GRPO {m} episodes, ES {m * scale} (x{scale}: 2 FLOPs "
            "per token and parameter for ES's forward-only rollout against GRPO's 2 + 6 per epoch + 2), PPO "
            f"{ppo} (ES's {m * scale} x 2 over PPO's factor: policy 2 + 6 per epoch + 2 old log-probs + 2 KL, "
            "critic 2 + 6 per epoch)")


def shapes_text(plan: Plan) -> str:
    """How each method fills its step's episodes at the plan's budget."""
    m = plan.episodes_per_step
    return (f"ES: {plan.population * matched_flops_scale(plan)} members x {m // plan.population} tasks, antithetic; "
            f"GRPO: {m // plan.group_size} tasks x group {plan.group_size}; PPO: {matched_episodes(plan, 'ppo')} tasks")


def budget_title(plan: Plan) -> str:
    """budget_text in one plot-title line: each method's episodes per step."""
    if matched_flops_scale(plan) == 1:
        return f"{plan.episodes_per_step} episodes per step for every method"
    eps = ", ".join(f"{LABELS[m]} {matched_episodes(plan, m)}" for m in plan.methods)
    return f"matched estimated model FLOPs per step, episodes: {eps}"


def report(plan: Plan, results: list[RunResult]) -> str:
    """The markdown of horizon.md (tables only; the curves are horizon.png)."""
    from esopt.utils.memory import fmt_mib  # torch: not at import time (the CLI's start-up)

    methods = [m for m in plan.methods if any(r.method == m for r in results)]
    by = {(m, h): [r for r in results if r.method == m and r.h_star == h] for m in plan.methods for h in plan.h_stars}
    m_eps = plan.episodes_per_step
    # what the runs were given: the defaults with the preset's and the command line's overrides applied
    configs = {m: run_config(plan, m, plan.h_stars[0], plan.seeds[0]) for m in plan.methods}
    used = {m: {k: getattr(getattr(c, m), k) for k in HPARAMS[m]} for m, c in configs.items()}
    first = next(iter(configs.values()))
    sp = first.sampling
    lines = [
        f"# Horizon benchmark: ES vs GRPO vs PPO on {plan.size}x{plan.size} Sudoku", "",
        (f"Model `tiny-sudoku` (warm start {plan.warm_start_steps} steps)" if plan.model == "tiny-sudoku"
         else f"Model `{plan.model}`") + f" ({first.model.resolved_dtype}); H* {plan.h_stars}; seeds {plan.seeds}; "
        f"{plan.steps} steps; {budget_text(plan)} ({shapes_text(plan)}); sampling T={sp.temperature}, "
        f"top-p {sp.top_p}, top-k {sp.top_k}, max {sp.max_new_tokens} new tokens; training score `{plan.reward}`; "
        f"held-out eval {plan.eval_tasks} tasks, binary success, every {plan.eval_every} steps. "
        f"Hyper-parameters as run: {json.dumps(used)}"
        + (f"; overrides {plan.overrides}" if plan.overrides else "") + ".", "",
        f"Context, {PAPER}.", "",
        "## Held-out success (final eval; mean ± std over seeds; base = the starting model)", "",
        "| H* | base | " + " | ".join(LABELS[m] for m in methods) + " |",
        "|---|---|" + "---|" * len(methods),
    ]
    for key, title in (("success_rate", None), ("shaped_reward", "Held-out shaped score")):
        if title:
            lines += ["", f"## {title} (0.5 success + 0.3 progress + 0.2 valid-move rate; final eval, mean ± std)",
                      "", "| H* | base | " + " | ".join(LABELS[m] for m in methods) + " |",
                      "|---|---|" + "---|" * len(methods)]
        for h in plan.h_stars:
            base = [r.summary["eval_before"][key] for m in methods for r in by[(m, h)] if r.summary.get("eval_before")]
            cells = []
            for m in methods:
                xs = [r.summary["eval_after"][key] for r in by[(m, h)] if r.summary.get("eval_after")]
                cells.append(f"{_mean(xs):.3f} ± {_std(xs):.3f} (n={len(xs)})" if xs else "n/a")
            lines.append(f"| {h} | {_mean(base):.3f} | " + " | ".join(cells) + " |")

    lines += paired_lines(plan, results)
    peak = {m: _mean([r.summary["peak_memory_bytes"] for h in plan.h_stars for r in by[(m, h)]]) for m in methods}
    infer = {
        m: _mean(
            [
                r.summary["inference_peak_bytes"]
                for h in plan.h_stars
                for r in by[(m, h)]
                if r.summary.get("inference_peak_bytes")
            ]
        )
        for m in methods
    }
    lines += ["", "## Peak memory (mean over runs; CPU: the run process's VmHWM; CUDA: "
              "torch.cuda.max_memory_allocated)", "",
              "| method | peak | inference-only peak | method / inference-only | method / ES |",
              "|---|---|---|---|---|"]
    for m in methods:
        lines.append(f"| {LABELS[m]} | {fmt_mib(peak[m])} | {fmt_mib(infer[m])} | {_ratio(peak[m], infer[m])} | "
                     f"{_ratio(peak[m], peak.get('es', math.nan))} |")
    if not plan.isolate:
        lines += ["", "Note: these runs shared one process, so each peak includes every earlier run's; run "
                  "with process isolation (the default of `--preset cpu`) to compare methods."]
    else:
        lines += ["", "Inference-only: the same model, in a fresh process, rolling out the run's largest batch "
                  f"(max of one step's {m_eps} episodes and the {plan.eval_tasks}-task eval, at most one "
                  "generate call's rows) with nothing else; measured in each (method, H*)'s first seed."]

    lines += time_lines(plan, by, methods)
    lines += ["", "Estimated model FLOPs per step: (prompt + generated tokens) x parameters x 2 for the rollout "
              "(no credit for shared-prefix reuse); GRPO and PPO add 6 per epoch (forward and backward over every "
              "turn's prompt and reply), 2 for the old log-probs when samples are reused (several epochs or "
              "minibatches), 2 for a KL reference, and PPO's critic 2 + 6 per epoch over the prompts.", "",
              "## Curves", "", "Against training episodes, one column per H*: held-out success and shaped score (first "
              "and last eval unless --eval-every), the training rollouts' success every step, and validation "
              "success every --curve-every steps (when on).", "",
              "![held-out, training and validation success vs training episodes, one column per H*](horizon.png)",
              "", "Against training wall-clock (one line per run; the CPU and its sharing set the scale):", "",
              "![success vs training wall-clock, one column per H*](horizon_wallclock.png)", ""]
    return "\n".join(lines)


def plot_curves(plan: Plan, results: list[RunResult], path: Path) -> Path:
    """One column per H*, against training episodes: held-out success, held-out shaped score (the evals) and
    the training rollouts' success (free, every step: ES's is its perturbed members', GRPO's and PPO's their
    on-policy samples'), one line per method (mean over seeds, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from esopt.utils.plots import save_figure

    def curves(r: RunResult, row: int) -> dict[int, float]:
        if row < 2:
            return {e[0] * r.episodes_per_step: e[row + 1] for e in r.evals}
        if row == 3:
            return {step * r.episodes_per_step: success for step, success in r.curve}
        return {int(t["step"]) * r.episodes_per_step: t["success_rate"] for t in r.train_rows if "success_rate" in t}

    n = len(plan.h_stars)
    labels = ["held-out success", "held-out shaped score", "training rollouts' success"]
    if any(r.curve for r in results):
        labels.append(f"validation success ({plan.curve_tasks} tasks)")
    fig, axes = plt.subplots(len(labels), n, figsize=(4.2 * n, 3.1 * len(labels)), squeeze=False)
    for row, label in enumerate(labels):
        for ax, h in zip(axes[row], plan.h_stars):
            for m in plan.methods:
                k = METHODS.index(m)  # one colour per method in every plot
                runs = [curves(r, row) for r in results if r.method == m and r.h_star == h]
                xs = sorted(set.intersection(*(set(e) for e in runs))) if runs else []
                if not xs:
                    continue
                ys = [[e[x] for e in runs] for x in xs]
                ax.plot(xs, [_mean(y) for y in ys], marker="o", color=f"C{k}", label=f"{LABELS[m]} (n={len(runs)})")
                ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=f"C{k}", alpha=0.15)
            ax.set(title=f"H* = {h}", xlabel="training episodes", ylabel=label)
            if row != 1:
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="best")
    # two lines: one panel column is narrower than the one-line title
    fig.suptitle(f"{plan.size}x{plan.size} Sudoku,\n" + budget_title(plan))
    return save_figure(fig, path)


def training_seconds(r: RunResult) -> dict[int, float]:
    """Step -> training seconds spent up to and including it (evals not counted; step 0: 0)."""
    total, at = 0.0, {0: 0.0}
    for row in sorted(r.train_rows, key=lambda t: t["step"]):
        total += row.get("seconds", math.nan)
        at[int(row["step"])] = total
    return at


def plot_wallclock(plan: Plan, results: list[RunResult], path: Path) -> Path:
    """Success against training wall-clock, one column per H*: the validation curve where the runs have one,
    else the held-out evals; one line per run (seeds differ in time, so no mean band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from esopt.utils.plots import save_figure

    n = len(plan.h_stars)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.3), squeeze=False)
    for ax, h in zip(axes[0], plan.h_stars):
        for r in (r for r in results if r.h_star == h):
            seconds = training_seconds(r)
            points = r.curve or [(step, success) for step, success, _ in r.evals]
            xs = [(seconds.get(step, math.nan) / 60, y) for step, y in points if step in seconds]
            k = METHODS.index(r.method)
            label = f"{LABELS[r.method]}" if r.seed == min(x.seed for x in results if x.method == r.method) else None
            ax.plot([x for x, _ in xs], [y for _, y in xs], marker=".", color=f"C{k}", alpha=0.8, label=label)
        ax.set(title=f"H* = {h}", xlabel="training wall-clock (min, evals excluded)",
               ylabel="validation success" if any(r.curve for r in results) else "held-out success")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"{plan.size}x{plan.size} Sudoku, one line per run")
    return save_figure(fig, path)


def write_report(plan: Plan, out: Path, also: Sequence[Path] = ()) -> tuple[Path, Path, str]:
    """OUT/horizon.md and OUT/horizon.png from the runs under OUT, then under each of `also` (runs that ran
    elsewhere: another machine, another session's out dir)."""
    from esopt.utils.io import write_text_atomic

    results = load_results(plan, [out, *also])
    text = report(plan, results)
    md = out / "horizon.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(md, text)
    write_text_atomic(out / "horizon_plan.json", json.dumps(asdict(plan), indent=1))
    plot_wallclock(plan, results, out / "horizon_wallclock.png")
    return md, plot_curves(plan, results, out / "horizon.png"), text


# --- command line ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt bench horizon", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                   help="cpu: the ~45-minute CPU default (tiny model); smollm2: the pretrained model on its "
                        "calibrated setting (hours); smoke: a seconds-long check (tests)")
    p.add_argument("--size", default=None,
                   help="board size 4 (default) or 6; 'smoke'/'cpu' are accepted as aliases of --preset")
    p.add_argument("--methods", nargs="+", choices=METHODS)
    p.add_argument("--model", choices=["tiny-sudoku", "smollm2"],
                   help="tiny-sudoku (default: the warm-started 1M-parameter Llama) or smollm2 (pretrained)")
    p.add_argument("--h-stars", nargs="+", type=int, help="horizons (holes = minimum turns), default 5 10 15")
    p.add_argument("--seeds", nargs="+", type=int, help="training seeds (tasks, members, sampling); default 0 1 2")
    p.add_argument("--steps", type=int, help="steps (GRPO/PPO) = generations (ES) per run")
    p.add_argument("--episodes-per-step", type=int, help="M: training episodes per step, the same for every method")
    p.add_argument("--population", type=int, help="ES members N (each runs M/N tasks)")
    p.add_argument("--budget", choices=BUDGETS,
                   help="episodes (default): M episodes per step for every method; flops: ES gets the episodes "
                        "that cost one GRPO step's estimated model FLOPs (N x 5 members at GRPO's 1 epoch) "
                        "and PPO the episodes that cost what ES's cost (M x 5 x 2 / 32 at 2 epochs)")
    p.add_argument("--group-size", type=int, help="GRPO group size G (M/G tasks per step)")
    p.add_argument("--eval-tasks", type=int, help="held-out tasks per eval")
    p.add_argument("--eval-every", type=int, help="eval every k steps (0: only first and last)")
    p.add_argument("--curve-every", type=int,
                   help="learning curve: success on --curve-tasks validation tasks every k steps (0: off)")
    p.add_argument("--curve-tasks", type=int, help="validation tasks per learning-curve eval (default 32)")
    p.add_argument("--warm-start-steps", type=int, help="supervised steps of the tiny-sudoku warm start")
    p.add_argument("--reward", choices=["success", "shaped", "env"], help="training score of every method")
    p.add_argument("--temperature", type=float, help="sampling temperature of every method's rollouts and evals")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides; es./grpo./ppo. keys go to that method only, others to all")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="one fresh process per run (honest peak memory); default on for cpu, off for smoke")
    p.add_argument("--no-memory-probe", action="store_true", help="skip the inference-only memory probe")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (1: no OpenMP oversubscription)")
    p.add_argument("--jobs", type=int, default=1,
                   help="isolated runs at once, each logging to its run dir's train.log (2 cores: 2 x --threads 1; "
                        "a GPU: more, best under an MPS daemon); the runs of one H* share one base eval")
    p.add_argument("--out", default="results", help="results root: OUT/horizon/<run>/, OUT/horizon.md, OUT/horizon.png")
    p.add_argument("--resume", action="store_true", help="skip finished runs (summary.json), continue partial ones")
    p.add_argument("--report-only", action="store_true", help="only rebuild horizon.md/png from existing runs")
    p.add_argument("--runs-from", nargs="+", default=[], metavar="DIR", type=Path,
                   help="also report the finished runs under these results roots (DIR/horizon/<run>), for runs "
                        "that ran elsewhere; a run under --out comes first")
    p.add_argument("--progress", action="store_true",
                   help="progress: bars on a terminal, plain lines with ETA in a log (isolated runs too)")
    return p


def plan_from_args(args: argparse.Namespace) -> Plan:
    preset = args.preset
    size = args.size
    if size in PRESETS:
        preset, size = size, None
    plan = Plan(**PRESETS[preset])
    if size is not None:
        if not str(size).isdigit():
            raise ValueError(f"--size must be 4 or 6 (or a preset name {sorted(PRESETS)}), got {size!r}")
        plan.size = int(size)
    fields = {"methods": args.methods, "h_stars": args.h_stars, "seeds": args.seeds, "steps": args.steps,
              "episodes_per_step": args.episodes_per_step, "population": args.population,
              "group_size": args.group_size, "eval_tasks": args.eval_tasks, "eval_every": args.eval_every,
              "warm_start_steps": args.warm_start_steps, "reward": args.reward, "isolate": args.isolate,
              "model": args.model, "temperature": args.temperature, "curve_every": args.curve_every,
              "curve_tasks": args.curve_tasks, "budget": args.budget}
    plan = replace(plan, **{k: v for k, v in fields.items() if v is not None},
                   overrides=[*plan.overrides, *args.overrides])  # the preset's, then the command line's
    if args.no_memory_probe:
        plan.measure_inference_peak = False
    plan.check()
    return plan


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    plan = plan_from_args(args)
    from esopt.experiments.sweep import check_jobs

    check_jobs(args.jobs, plan.isolate)  # before the warm start or any run
    missing = [str(d) for d in args.runs_from if not (d / "horizon").is_dir()]
    if missing:
        raise ValueError(f"--runs-from: no horizon/ run folder under {', '.join(missing)}")
    out = Path(args.out)
    failed: list[str] = []
    t = time.perf_counter()
    if not args.report_only:
        failed = run_all(plan, out, resume=args.resume, threads=args.threads, progress=args.progress,
                         jobs=args.jobs)
    md, png, text = write_report(plan, out, args.runs_from)
    print(text)
    print(f"wrote {md} and {png} ({time.perf_counter() - t:.0f}s)")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
