"""One script, two trainers: TRL's `GRPOTrainer` and esopt's `ESTrainer` (and esopt's own GRPO), on the same
model, dataset, reward functions and budget.

    python examples/trl_swap.py --smoke                             # tiny random model, 2 steps each: ~1 minute
    python examples/trl_swap.py --model smollm2 --steps 30 --out runs/trl_swap   # the side-by-side (CPU: hours)

The swap itself is the two `make_trainer` branches below: the same `reward_funcs`, `train_dataset` and shared
settings, `GRPOConfig` -> `ESConfig`, `GRPOTrainer` -> `ESTrainer`.

Task: reasoning-gym's `basic_arithmetic` (offline, seeded; train and test rows from disjoint seeds), as chat
prompts. Rewards (TRL's signature): `correct` (1 if the first number of the reply equals the answer) and
`answers_with_a_number` (0.1 if the reply starts with a number; None otherwise, so it abstains).
Budget per step: GRPO `--prompts` prompts x `--group` completions; ES `--population` members x `--prompts`
prompts, with `--budget flops` (default) x4 members for the same estimated model FLOPs (ES's forward-only 2 FLOPs
per token and parameter against GRPO's 2 + 6: the rollout, then one forward and backward; both GRPOs here run
one epoch on fresh samples with no KL term, so neither computes old or reference log-probs), or the same
completions with
`--budget episodes`.

Each trainer runs in a fresh process (its own peak RSS, VmHWM), then every model, the base included, is scored
the same way: greedy, on the same test rows, paired with the base (bootstrap 95% over rows, McNemar).
Writes OUT/trl_side_by_side.md and OUT/results.json. Several runs into one OUT (e.g. each trainer with its own
tuned settings, or on its own core) add up: a run scored on the same rows merges its trainers into OUT's results.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TRAINERS = ("trl-grpo", "es", "esopt-grpo")
SYSTEM = "Answer with the number only."
NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


# --- the task: dataset and reward functions (TRL's signature) ---------------------------------------------

def arithmetic_rows(n: int, seed: int) -> list[dict]:
    import reasoning_gym

    data = reasoning_gym.create_dataset("basic_arithmetic", size=n, seed=seed, min_terms=2, max_terms=2,
                                        min_digits=1, max_digits=2)
    return [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": str(x["question"])}],
             "answer": str(x["answer"])} for x in data]


def reply(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def correct(prompts, completions, answer, **kwargs) -> list[float]:
    from esopt.envs.tools.answers import math_equal

    out = []
    for c, gold in zip(completions, answer):
        m = NUMBER.match(reply(c))
        out.append(float(bool(m) and math_equal(m.group(1), gold)))
    return out


def answers_with_a_number(prompts, completions, **kwargs) -> list[float | None]:
    return [0.1 if NUMBER.match(reply(c)) else None for c in completions]


REWARD_FUNCS = [correct, answers_with_a_number]


# --- one trainer, in its own process ----------------------------------------------------------------------

def make_trainer(name: str, a: argparse.Namespace, model_dir: str, train_ds, out: Path):
    shared = dict(output_dir=str(out), learning_rate=a.lr if name != "es" else a.es_lr, max_steps=a.steps,
                  max_completion_length=a.max_tokens, temperature=temperature(name, a), logging_steps=1,
                  seed=a.seed)
    if name == "trl-grpo":
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(**shared, num_generations=a.group, per_device_train_batch_size=a.prompts * a.group,
                          lr_scheduler_type=a.lr_schedule,
                          beta=0.0, use_cpu=True, bf16=False, gradient_checkpointing=False, save_strategy="no",
                          report_to="none", dataloader_num_workers=0)
        return GRPOTrainer(model=model_dir, reward_funcs=REWARD_FUNCS, train_dataset=train_ds, args=args)
    from esopt import ESConfig, ESTrainer

    args = ESConfig(**shared, population_size=es_members(a), prompts_per_member=a.prompts, sigma=a.sigma,
                    sigma_min=a.sigma / 2, noise=a.es_noise, batched=a.batched, save_steps=a.steps,
                    report_to="none", success_threshold=1.0)
    return ESTrainer(model=model_dir, reward_funcs=REWARD_FUNCS, train_dataset=train_ds, args=args)


def temperature(name: str, a: argparse.Namespace) -> float:
    """The trainer's sampling temperature: ES may roll out greedy (its own regime), the GRPOs need samples."""
    return a.es_temperature if name == "es" and a.es_temperature is not None else a.temperature


def settings(name: str, a: argparse.Namespace) -> str:
    """What was set for this trainer, for the report's table."""
    if name == "es":
        noise = f"{a.es_noise}{' batched' if a.batched else ''}"
        return (f"{es_members(a)} x {a.prompts}, sigma {a.sigma:g}->{a.sigma / 2:g}, alpha {a.es_lr:g}, {noise}, "
                f"T {temperature(name, a):g}")
    return f"{a.prompts} x {a.group}, lr {a.lr:g} {a.lr_schedule}, T {temperature(name, a):g}"


def es_members(a: argparse.Namespace) -> int:
    """ES's population: x4 at matched FLOPs (2 per token and parameter vs GRPO's 2 + 6 at one epoch, no KL)."""
    return a.population * (4 if a.budget == "flops" else 1)


def esopt_grpo(a: argparse.Namespace, model_dir: str, train_rows: list[dict], out: Path) -> tuple[Path, float]:
    """esopt's own GRPO on the same rows and reward functions (its env is the dataset, as ESTrainer's)."""
    from esopt.train import trainer
    from esopt.train.es_trainer import dataset_config

    data = {"algo": "grpo", "seed": a.seed, "steps": a.steps, "checkpoint_every": a.steps,
            "measure_inference_peak": False, "tensorboard": False,
            "model": {"name": model_dir, "dtype": "float32"},
            "sampling": {"temperature": temperature("esopt-grpo", a), "top_p": 1.0, "top_k": 0,
                         "max_new_tokens": a.max_tokens},
            "eval": {"every": 0},
            "grpo": {"tasks_per_step": a.prompts, "group_size": a.group, "lr": a.lr, "lr_schedule": a.lr_schedule,
                     "kl_beta": 0.0, "epochs": 1,
                     "minibatch_size": a.prompts * a.group, "micro_batch_size": min(16, a.prompts * a.group),
                     "reward": "env"}}
    summary = trainer("grpo")(dataset_config(data, train_rows, [], REWARD_FUNCS), out, progress=False)
    return out / "final", summary["seconds_per_step"]


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def train_one(name: str, a: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset

    torch.set_num_threads(a.threads)
    out = Path(a.out) / name
    rows = arithmetic_rows(a.train_rows, seed=a.seed)
    t = time.perf_counter()
    # seconds per step: each trainer's own count of its training time (model loading and evals left out)
    if name == "esopt-grpo":
        final, per_step = esopt_grpo(a, a.model_dir, rows, out)
    else:
        trainer = make_trainer(name, a, a.model_dir, Dataset.from_list(rows), out)
        if name == "trl-grpo":
            per_step = trainer.train().metrics["train_runtime"] / a.steps
            final = out / "final"
            trainer.save_model(str(final))
        else:
            per_step = trainer.train(progress=False)["seconds_per_step"]
            final = out / "final"
    seconds = time.perf_counter() - t
    result = {"trainer": name, "seconds": seconds, "seconds_per_step": per_step,
              "peak_rss_bytes": peak_rss_bytes(), "final": str(final), "settings": settings(name, a),
              "command": "python examples/trl_swap.py " + " ".join(a.argv[:a.argv.index("--train-only")])}
    (out / "result.json").write_text(json.dumps(result, indent=1))


# --- the driver: base model, one process per trainer, the same eval for all -------------------------------

def base_model_dir(a: argparse.Namespace) -> str:
    """A local HF dir every trainer starts from: SmolLM2 (converted once) or the tiny model saved under OUT."""
    if a.model == "smollm2":
        from esopt.models.smollm2 import smollm2_path

        return str(smollm2_path())
    if a.model != "tiny":
        return a.model
    path = Path(a.out) / "base_model"
    if not (path / "config.json").exists():
        from esopt.models import load_policy

        policy = load_policy("tiny", seed=a.seed)
        policy.model.save_pretrained(path)
        policy.tokenizer.save_pretrained(path)
    return str(path)


def evaluate(model_dir: str, rows: list[dict], max_tokens: int) -> list[int]:
    """Greedy success (correct == 1) on each test row."""
    from esopt.engines.base import SamplingParams
    from esopt.envs.dataset import PromptDatasetEnv
    from esopt.models import load_policy
    from esopt.rollout.engine import run_episodes

    policy = load_policy(model_dir, dtype="float32")
    trajectories, _ = run_episodes(policy, lambda: PromptDatasetEnv(rows, [correct]), list(range(len(rows))),
                                   SamplingParams(temperature=0.0, max_new_tokens=max_tokens), seed=0)
    return [int(t.success) for t in trajectories]


def change(before: list[int], after: list[int]) -> str:
    """after - before, paired over tasks: mean [95% bootstrap interval]."""
    from esopt.utils.stats import paired_difference

    d = paired_difference(before, after, tasks=len(before))
    return f"{d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"


def grpo_gap(scores: dict, label: str) -> list[str]:
    """esopt's GRPO against TRL's on the same tasks, where both ran."""
    from esopt.utils.stats import mcnemar_p

    if "trl-grpo" not in scores or "esopt-grpo" not in scores:
        return []
    return ["", f"esopt's GRPO - TRL's GRPO{label}: {change(scores['trl-grpo'], scores['esopt-grpo'])} "
                f"(McNemar p {mcnemar_p(scores['trl-grpo'], scores['esopt-grpo']):.3g})."]


def report(a: argparse.Namespace, results: dict, scores: dict) -> str:
    from esopt.utils.stats import mcnemar_p

    base = scores["base"]
    n = len(base)
    names = [name for name in TRAINERS if name in scores]
    lines = [
        "# TRL's GRPOTrainer vs esopt's ESTrainer (and esopt's GRPO), one script", "",
        f"Model `{a.model}` (fp32); reasoning-gym basic_arithmetic, {a.train_rows} train rows, {n} {a.split} rows "
        f"(other seeds; rows seen in training dropped); {a.steps} steps each; GRPO: prompts x completions per "
        f"step, no KL; ES: members x prompts each (budget: {a.budget}); max {a.max_tokens} new tokens; scored "
        f"greedy, success = `correct`. CPU: {cpu_name()}, {a.threads} torch thread(s) per trainer.", "",
        f"| model | settings | {a.split} success | vs base [95%] | McNemar p | s / step | peak RSS |",
        "|---|---|---|---|---|---|---|",
        f"| base | | {sum(base) / n:.3f} | | | | |",
    ]
    for name in names:
        r = results[name]
        lines.append(f"| {name} | {r.get('settings', '')} | {sum(scores[name]) / n:.3f} | "
                     f"{change(base, scores[name])} | {mcnemar_p(base, scores[name]):.3g} | "
                     f"{r['seconds_per_step']:.1f} | {r['peak_rss_bytes'] / 2**20:.0f} MiB |")
    commands = sorted({results[name].get("command", "") for name in names} - {""})
    lines += ["", "Command(s):", ""] + [f"    {c}" for c in commands]
    return "\n".join(lines + grpo_gap(scores, "")) + "\n"


def comparison_key(a: argparse.Namespace) -> dict:
    """What runs sharing one OUT must have in common: the scored rows, the base's greedy answers on them
    (model, token cap, threads) and the budget (steps)."""
    return {"model": a.model, "split": a.split, "seed": a.seed, "train_rows": a.train_rows,
            "test_rows": a.test_rows, "max_tokens": a.max_tokens, "threads": a.threads, "steps": a.steps,
            "budget": a.budget}


def merge_results(previous: dict | None, key: dict, results: dict, scores: dict) -> dict:
    """This run's trainers added to OUT's earlier results with the same key (a trainer run again replaces its
    entry); earlier results under another key are an error, not silently mixed in."""
    if previous is None:
        return {"key": key, "results": results, "scores": scores}
    if previous.get("key") != key:
        raise SystemExit(f"error: this run ({key}) differs from the one in OUT/results.json "
                         f"({previous.get('key')}): use another --out")
    return {"key": key, "results": {**previous["results"], **results}, "scores": {**previous["scores"], **scores}}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def eval_rows(a: argparse.Namespace) -> list[dict]:
    """The split's rows from its own seeds, without any row seen in training (and, for test, in validation):
    settings are chosen on validation, reported on test."""
    key = lambda r: json.dumps(r["prompt"])  # noqa: E731
    seen = {key(r) for r in arithmetic_rows(a.train_rows, seed=a.seed)}
    validation = [r for r in arithmetic_rows(a.test_rows, seed=20_000 + a.seed) if key(r) not in seen]
    if a.split == "validation":
        return validation
    seen |= {key(r) for r in validation}
    return [r for r in arithmetic_rows(a.test_rows, seed=10_000 + a.seed) if key(r) not in seen]


def pool(outs: list[str]) -> str:
    """One table over several runs of this script (e.g. seeds): each run's rows, then all runs' tasks pooled
    into one paired interval per trainer."""
    from esopt.utils.stats import mcnemar_p

    runs = [json.loads((Path(o) / "results.json").read_text()) for o in outs]
    names = [n for n in TRAINERS if all(n in r["scores"] for r in runs)]
    lines = ["| run | trainer | settings | success | vs base [95%] | s / step | peak RSS |",
             "|---|---|---|---|---|---|---|"]
    for out, r in zip(outs, runs):
        base = r["scores"]["base"]
        lines.append(f"| {out} | base | | {sum(base) / len(base):.3f} | | | |")
        for n in names:
            lines.append(f"| {out} | {n} | {r['results'][n].get('settings', '')} | "
                         f"{sum(r['scores'][n]) / len(base):.3f} | {change(base, r['scores'][n])} | "
                         f"{r['results'][n]['seconds_per_step']:.1f} | "
                         f"{r['results'][n]['peak_rss_bytes'] / 2**20:.0f} MiB |")
    base = [x for r in runs for x in r["scores"]["base"]]
    lines += ["", f"Pooled over {len(runs)} runs ({len(base)} tasks, paired within each run):", "",
              "| trainer | success | vs base [95%] | McNemar p |", "|---|---|---|---|",
              f"| base | {sum(base) / len(base):.3f} | | |"]
    pooled = {n: [x for r in runs for x in r["scores"][n]] for n in names}
    for n, got in pooled.items():
        lines.append(f"| {n} | {sum(got) / len(got):.3f} | {change(base, got)} | {mcnemar_p(base, got):.3g} |")
    return "\n".join(lines + grpo_gap(pooled, ", pooled")) + "\n"


def main(argv: list[str] | None = None) -> int:
    from esopt.utils.io import write_json_atomic, write_text_atomic

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny (a random tiny Llama: smoke only), smollm2, or a HF dir")
    p.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (GRPO) = per member (ES)")
    p.add_argument("--group", type=int, default=8, help="GRPO completions per prompt")
    p.add_argument("--population", type=int, default=8, help="ES members at --budget episodes")
    p.add_argument("--budget", choices=["flops", "episodes"], default="flops")
    p.add_argument("--lr", type=float, default=1e-5, help="both GRPOs' AdamW learning rate")
    p.add_argument("--lr-schedule", choices=["linear", "constant"], default="linear",
                   help="both GRPOs' lr schedule (linear decay to 0: TRL's default)")
    p.add_argument("--es-lr", type=float, default=4e-3, help="ES step size alpha")
    p.add_argument("--sigma", type=float, default=8e-3, help="ES noise scale (cosine to half of it)")
    p.add_argument("--es-noise", choices=["normal", "lowrank"], default="normal",
                   help="ES noise: dense Gaussian, or rank-1 (EGGROLL), which --batched needs")
    p.add_argument("--batched", action="store_true",
                   help="ES: every member's completions in one generate call (with --es-noise lowrank one "
                        "model serves all; with normal noise each member gets a copy)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature in training")
    p.add_argument("--es-temperature", type=float,
                   help="ES's own (default: --temperature); 0 rolls members out greedy, as esopt's ES runs do")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--train-rows", type=int, default=512)
    p.add_argument("--test-rows", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=["test", "validation"], default="test",
                   help="rows the trainers are scored on: tune on validation, report on test (disjoint seeds)")
    p.add_argument("--pool", nargs="+", metavar="OUT", help="only print one table over these finished --out dirs")
    p.add_argument("--threads", type=int, default=1, help="torch threads per trainer process")
    p.add_argument("--out", default="runs/trl_swap")
    p.add_argument("--smoke", action="store_true", help="tiny model, 2 steps, 8 test rows")
    p.add_argument("--train-only", choices=TRAINERS, help=argparse.SUPPRESS)  # the child process
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    a.argv = argv
    if a.pool:
        print(pool(a.pool))
        return 0
    if a.smoke:
        a.model, a.steps, a.test_rows, a.train_rows, a.group, a.population = "tiny", 2, 8, 16, 2, 2
        a.prompts, a.max_tokens = 2, 4
    if a.train_only:
        train_one(a.train_only, a)
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    saved, key = Path(a.out) / "results.json", comparison_key(a)
    if saved.exists():  # refuse a mismatched OUT before hours of training, not after
        merge_results(json.loads(saved.read_text()), key, {}, {})
    model_dir = base_model_dir(a)
    results = {}
    for name in a.trainers:
        print(f"training {name} ...", flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TRL_EXPERIMENTAL_SILENCE": "1"}
        subprocess.run([sys.executable, __file__, *argv, "--train-only", name, "--model-dir", model_dir],
                       check=True, env=env)
        results[name] = json.loads((Path(a.out) / name / "result.json").read_text())
    test = eval_rows(a)
    scores = {name: evaluate(results[name]["final"], test, a.max_tokens) for name in a.trainers}
    with open(Path(a.out) / "results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # runs sharing OUT (one per core) merge one at a time
        previous = json.loads(saved.read_text()) if saved.exists() else None
        if previous is not None and previous.get("key") == key:
            scores["base"] = previous["scores"]["base"]  # the same rows, greedy: the same base answers
        else:
            scores["base"] = evaluate(model_dir, test, a.max_tokens)
        merged = merge_results(previous, key, results, scores)
        text = report(a, merged["results"], merged["scores"])
        write_text_atomic(Path(a.out) / "trl_side_by_side.md", text)
        write_json_atomic(saved, merged)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
