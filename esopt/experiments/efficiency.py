"""`esopt bench efficiency`: one ES generation of the real training path next to pure inference of exactly the
same prompts and generated token counts: how close each population backend comes to the inference limit.

The ES side is `train.es.ESAlgorithm.step` itself (HFEngine with its shared-prefix KV, the config's multi-turn
env, ask -> evaluate -> tell) for each backend:
- `full-rank sequential`: the local evaluator, dense Gaussian noise written into the weights member by member;
- `low-rank in place`: the local evaluator with rank-r noise;
- `low-rank batched`: the batched evaluator, all G x E episodes in one rollout, each row adding its member's term.
Every `engine.generate` call is recorded (its prompts, each row's generated tokens). Pure inference then replays
those prompts with the unperturbed model, decoding exactly the recorded number of steps per call with EOS
disabled (the same tokens to generate), keeping the prefix KV across calls (weights are fixed: the floor's
right), in several layouts: the calls as recorded, all rows of one turn in one call, and fixed batch sizes over
all rows (`--floor-batches`). The fastest layout is the floor. The gap (backend - floor) is split into noise
generation (timed apart), perturb, the batched forward hooks (CPU), restore, the update (ES.tell), rollout
bookkeeping (rollout time outside `engine.generate`: envs, prompts), decoding beyond the floor and the rest.
Peak memory (RSS) of each backend's generation and of inference alone (one call of the rows the backend rolls out
together: E, or G x E batched, or `es.members_per_rollout` x E; `train.memprobe`, as a training run's memory_ratio)
is measured in fresh processes.

    esopt bench efficiency --model smollm2 --members 32 --tasks 4 --threads 2 --repeats 3   # the demo's Sudoku
    esopt bench efficiency --model tiny --members 4 --tasks 2 --repeats 1 --no-memory        # seconds
    esopt bench efficiency --config configs/smoke.yaml --backends batched --set sampling.max_new_tokens=16
    esopt bench efficiency --model smollm2 --backends batched --set es.members_per_rollout=8   # 4 rollouts of 8

Weights are reset to the base model before every repeat, so each repeat runs the same generation 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from esopt.experiments.gpu import sync
from esopt.experiments.population import MODE_OVERRIDES
from esopt.utils.memory import fmt_mib
from esopt.utils.report import write_report

BACKENDS = {"full-rank": "full-rank sequential", "low-rank": "low-rank in place", "batched": "low-rank batched"}
NO_EOS = (-1,)  # no token has id -1: with it as the only stop id every row decodes the call's full step count
PHASES = ("noise", "perturb (excl. noise)", "batched hooks", "restore", "update (ES.tell)", "rollout bookkeeping",
          "decode beyond floor", "other")


@dataclass
class Call:
    """One recorded `engine.generate` call: its turn in the rollout, prompts and each row's token counts."""

    turn: int
    prompts: list[str]
    prompt_tokens: list[int]
    tokens: list[int]
    seconds: float


@dataclass
class Recorder:
    """Stands in for `engine.generate` and `engine.rollout_scope` (instance attributes shadow the methods): every
    call is recorded and timed; a rollout's calls are numbered by turn (one call per turn: max_batch_size null)."""

    engine: object
    calls: list[Call] = field(default_factory=list)
    turn: int = 0

    def generate(self, prompts, sampling, seed=None, return_logprobs=False, members=None):
        t = time.perf_counter()
        out = type(self.engine).generate(self.engine, prompts, sampling, seed=seed, return_logprobs=return_logprobs,
                                         members=members)
        sync(self.engine.device)
        self.calls.append(Call(self.turn, list(prompts), [len(c.prompt_ids) for c in out],
                               [len(c.token_ids) for c in out], time.perf_counter() - t))
        self.turn += 1
        return out

    @contextlib.contextmanager
    def rollout_scope(self, **kwargs) -> Iterator[None]:
        self.turn = 0
        with type(self.engine).rollout_scope(self.engine, **kwargs):
            yield


@contextlib.contextmanager
def recording(engine) -> Iterator[Recorder]:
    rec = Recorder(engine)
    engine.generate, engine.rollout_scope = rec.generate, rec.rollout_scope
    try:
        yield rec
    finally:
        del engine.generate, engine.rollout_scope


class HookClock:
    """Seconds spent inside `BatchedLowRank`'s forward hooks. `members()` registers `host._hook(name)`, so a timing
    wrapper set as an instance attribute is what gets registered (CPU only: CUDA hooks run asynchronously)."""

    def __init__(self, host):
        self.seconds, inner = 0.0, host._hook

        def timed(name: str):
            hook = inner(name)

            def run(module, inputs, output):
                t = time.perf_counter()
                out = hook(module, inputs, output)
                self.seconds += time.perf_counter() - t
                return out

            return run

        host._hook = timed


def draw_noise(perturbation, seeds: list[int]) -> float:
    """Seconds to draw every member's noise once, as perturb (or the batched host) draws it."""
    from esopt.es.perturbation import GaussianNoise, LowRankNoise

    dense = perturbation.chunks if isinstance(perturbation, GaussianNoise) else perturbation.noise.chunks
    t = time.perf_counter()
    for seed in seeds:
        for name, p in perturbation.params:
            if isinstance(perturbation, LowRankNoise) and p.dim() == 2:
                perturbation.factors(seed, name, p.shape, p.device)
            else:
                for _ in dense(seed, name, p.numel(), p.device):
                    pass
    sync(perturbation.params[0][1].device)
    return time.perf_counter() - t


def reset_weights(policy, base: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            p.copy_(base[name])
    policy.weights_changed()


def backend_config(args: argparse.Namespace, key: str):
    from esopt.train.config import load_config

    common = [f"es.population_size={args.members}", "es.antithetic=true", f"es.tasks_per_member={args.tasks}",
              "measure_inference_peak=false", *([f"model.name={args.model}"] if args.model else [])]
    return load_config(args.config, [*common, *args.set, *MODE_OVERRIDES[BACKENDS[key]], "max_batch_size=null"])


def one_generation(config, policy, noise: bool, progress: bool) -> dict:
    """ESAlgorithm.step(0) in a scratch run dir, every generate call recorded; its phases in seconds."""
    from esopt.train.es import ESAlgorithm
    from esopt.train.rundir import RunDir
    from esopt.train.tasks import env_factory
    from esopt.utils.timers import Timers

    timers = Timers()
    with tempfile.TemporaryDirectory(prefix="esopt-efficiency-") as tmp:
        alg = ESAlgorithm(policy, config, RunDir(tmp), env_factory(config), timers, 0, progress)
        host = getattr(alg.evaluator, "host", None)
        hooks = HookClock(host) if host is not None and policy.device.type == "cpu" else None
        try:
            with recording(policy) as rec:
                t = time.perf_counter()
                row = alg.step(0)
                sync(policy.device)
                seconds = time.perf_counter() - t
        finally:
            alg.close()
        noise_s = draw_noise(alg.es.perturbation, [m.seed for m in alg.es.ask(0)]) if noise else None
    generate = sum(c.seconds for c in rec.calls)
    return {"seconds": seconds, "calls": rec.calls, "generated_tokens": row["generated_tokens"],
            "prompt_tokens": sum(sum(c.prompt_tokens) for c in rec.calls), "generate": generate,
            "noise": noise_s, "perturb": timers.perturb, "restore": timers.restore, "update": timers.update,
            "bookkeeping": timers.rollout - generate, "hooks": None if hooks is None else hooks.seconds}


# --- pure inference of the recorded calls ---------------------------------------------------------------

Row = tuple[str, int]  # (prompt, generated tokens to match)


def layout(calls: list[Call], name: str) -> list[list[Row]]:
    """The recorded rows cut into calls: "as recorded", "one call per turn" (every rollout's rows of one turn
    together), or "batches of B" over all rows, turn-major (pure inference knows every prompt in advance)."""
    recorded = [list(zip(c.prompts, c.tokens)) for c in calls]
    if name == "as recorded":
        return recorded
    by_turn = [[r for c, rows in zip(calls, recorded) if c.turn == t for r in rows]
               for t in sorted({c.turn for c in calls})]
    if name == "one call per turn":
        return by_turn
    b, flat = int(name.removeprefix("batches of ")), [r for rows in by_turn for r in rows]
    return [flat[i:i + b] for i in range(0, len(flat), b)]


def layouts(calls: list[Call], batch_sizes: list[int]) -> dict[str, list[list[Row]]]:
    """Every layout pure inference tries; one that cuts the rows as an earlier one does is left out."""
    out: dict[str, list[list[Row]]] = {}
    for name in ("as recorded", "one call per turn", *(f"batches of {b}" for b in sorted(set(batch_sizes)))):
        chunks = layout(calls, name)
        if chunks not in out.values():
            out[name] = chunks
    return out


def decode_rows(policy, rows: list[Row], store) -> int:
    """One pure-inference call: greedy, max(recorded) steps for every row, EOS disabled; the tokens it generated,
    counted per row up to what the ES call generated there (a row past its EOS decodes as padding there too)."""
    from esopt.engines.base import SamplingParams
    from esopt.engines.prefix import generate_with_shared_prefix, shared_prefix_length

    steps = max(n for _, n in rows)
    if steps == 0:
        return 0
    tok = policy.tokenizer
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p, _ in rows]
    prefix = shared_prefix_length(ids)
    if prefix:
        tokens, _ = generate_with_shared_prefix(policy.model, ids, prefix, SamplingParams(0.0, max_new_tokens=steps),
                                                NO_EOS, tok.pad_token_id, store=store)
    else:  # no shared prefix (one-token prompts): plain generate, EOS suppressed until the last step
        enc = tok([p for p, _ in rows], return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
        with torch.inference_mode():
            out = policy.model.generate(**enc, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        tokens = out[:, enc["input_ids"].shape[1]:].tolist()
    tok.batch_decode(tokens, skip_special_tokens=True)  # the engine decodes text too
    return sum(min(len(t), n) for t, (_, n) in zip(tokens, rows))


def time_layout(policy, chunks: list[list[Row]]) -> tuple[float, int]:
    """(seconds, generated tokens) of pure inference in one layout; one prefix KV store across its calls."""
    from esopt.engines.prefix import PrefixKV

    store = PrefixKV()
    sync(policy.device)
    t = time.perf_counter()
    tokens = sum(decode_rows(policy, rows, store) for rows in chunks)
    sync(policy.device)
    return time.perf_counter() - t, tokens


def prefix_seconds(policy, calls: list[Call]) -> tuple[int, float]:
    """(tokens, seconds) of encoding the shared prefix of every recorded prompt (system prompt, worked examples)
    once with the unperturbed model, best of 3. Each ES member must encode it under its own weights, pure
    inference only once: G - 1 of these passes are work no ES backend can skip (bar the embedding layer)."""
    from esopt.engines.prefix import shared_prefix_length

    ids = [policy.tokenizer(p, add_special_tokens=False)["input_ids"] for c in calls for p in c.prompts]
    n = shared_prefix_length(ids)
    if n == 0:
        return 0, 0.0
    x = torch.tensor([ids[0][:n]], device=policy.device)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(3):
            sync(policy.device)
            t = time.perf_counter()
            policy.model(input_ids=x, use_cache=True)
            sync(policy.device)
            best = min(best, time.perf_counter() - t)
    return n, best


def ceiling(row: dict, members: int) -> float:
    """The best inference/backend ratio an ES generation can reach when its only extra work over pure inference
    is each member's own pass over the shared prefix: floor / (floor + (G - 1) x prefix pass)."""
    return row["floor"] / (row["floor"] + (members - 1) * row["prefix_seconds"])


# --- one backend, then the report -----------------------------------------------------------------------

def measure_backend(key: str, args: argparse.Namespace, policy, base: dict, log) -> dict:
    """R repeats of the backend's generation 0, each followed by pure inference of its own recorded calls: every
    layout after the first repeat, the fastest one after the others."""
    config = backend_config(args, key)
    runs, floors, floor_layouts, best = [], [], {}, None
    for r in range(args.repeats):
        log(f"{BACKENDS[key]}, repeat {r + 1}/{args.repeats}: one ES generation, G={args.members} x E={args.tasks}")
        reset_weights(policy, base)
        run = one_generation(config, policy, noise=r == 0, progress=args.progress)
        reset_weights(policy, base)  # pure inference: the unperturbed model
        if best is None:
            shapes = layouts(run["calls"], args.floor_batches)
            floor_layouts = {name: (*time_layout(policy, chunks), len(chunks)) for name, chunks in shapes.items()}
            best = min(floor_layouts, key=lambda n: floor_layouts[n][0])
            floor_s, floor_tokens, _ = floor_layouts[best]
        else:
            floor_s, floor_tokens = time_layout(policy, layout(run["calls"], best))
        runs.append(run)
        floors.append({"seconds": floor_s, "generated_tokens": floor_tokens})
        log(f"{BACKENDS[key]}, repeat {r + 1}/{args.repeats}: ES generation {run['seconds']:.2f}s, pure inference "
            f"{floor_s:.2f}s ({best}), {run['generated_tokens']} tokens")
    i = min(range(len(runs)), key=lambda k: runs[k]["seconds"])
    prefix_tokens, prefix_s = prefix_seconds(policy, runs[i]["calls"])
    summary = {k: v for k, v in runs[i].items() if k != "calls"}
    summary["noise"] = runs[0]["noise"]
    return {"backend": BACKENDS[key], "key": key, **summary, "floor": min(f["seconds"] for f in floors),
            "floor_layout": best, "floor_generated_tokens": floors[i]["generated_tokens"],
            "layouts": {n: {"seconds": s, "calls": c} for n, (s, _, c) in floor_layouts.items()},
            "calls": len(runs[i]["calls"]), "prefix_tokens": prefix_tokens, "prefix_seconds": prefix_s,
            "repeats": [r["seconds"] for r in runs], "floor_repeats": [f["seconds"] for f in floors]}


def gap_phases(row: dict) -> dict[str, float | None]:
    """Seconds of each phase of the gap (backend - floor); `other` is what no named phase holds."""
    noise = row["noise"] or 0.0
    hooks = row["hooks"] or 0.0
    named: dict[str, float | None] = {
        "noise": row["noise"], "perturb (excl. noise)": max(row["perturb"] - noise, 0.0),
        "batched hooks": row["hooks"], "restore": row["restore"], "update (ES.tell)": row["update"],
        "rollout bookkeeping": row["bookkeeping"], "decode beyond floor": row["generate"] - hooks - row["floor"]}
    named["other"] = row["seconds"] - row["floor"] - sum(v for v in named.values() if v is not None)
    return named


def layout_label(row: dict, name: str) -> str:
    calls = row["layouts"][name]["calls"]
    return f"{name}, {calls} call{'s' if calls > 1 else ''}"


def spread(values: list[float]) -> str:
    return f"{(max(values) - min(values)) / min(values):.1%}" if len(values) > 1 and min(values) > 0 else "-"


def main_table(result: dict) -> list[str]:
    lines = [f"model {result['model']} ({result['dtype']}, {result['params'] / 1e6:.1f}M params), config "
             f"{result['config']}, G={result['members']} members x E={result['tasks']} tasks, {result['threads']} "
             f"threads, {result['device']}, best of {result['repeats']} repeat(s)", "",
             "| backend | seconds per generation | pure inference (best layout) seconds | ratio inference/backend | "
             "prefix-bound ceiling | ratio / ceiling | generated tokens | prompt tokens |",
             "|---|---|---|---|---|---|---|---|"]
    g = result["members"]
    for r in result["rows"]:
        floor, ratio = f"{r['floor']:.2f} ({layout_label(r, r['floor_layout'])})", r["floor"] / r["seconds"]
        cap = ceiling(r, g)
        lines.append(f"| {r['backend']} | {r['seconds']:.2f} | {floor} | {ratio:.3f} | {cap:.3f} | {ratio / cap:.3f} | "
                     f"{r['generated_tokens']} | {r['prompt_tokens']} |")
    if rows := result["rows"]:
        r = rows[0]
        lines += ["", f"Prefix-bound ceiling: every member encodes the {r['prefix_tokens']}-token shared prefix under "
                  f"its own weights ({r['prefix_seconds']:.3f} s a pass), pure inference once: floor / (floor + "
                  f"{g - 1} x {r['prefix_seconds']:.3f} s). No ES backend exceeds it at this G and E."]
    return lines


def gap_table(rows: list[dict]) -> list[str]:
    lines = ["Where the gap (backend - pure inference) goes: seconds (share of the gap). Noise is timed apart and "
             "taken out of perturb; hooks are timed on CPU only.", "",
             "| backend | gap s | " + " | ".join(PHASES) + " |", "|---|---|" + "---|" * len(PHASES)]
    for r in rows:
        gap, phases = r["seconds"] - r["floor"], gap_phases(r)
        cells = ["-" if phases[p] is None else f"{phases[p]:.3f} ({phases[p] / gap:.0%})" if gap > 0 else
                 f"{phases[p]:.3f}" for p in PHASES]
        lines.append(f"| {r['backend']} | {gap:.2f} | " + " | ".join(cells) + " |")
    return lines


def repeats_table(rows: list[dict]) -> list[str]:
    lines = ["Pure inference by layout, seconds (first repeat):", ""]
    for r in rows:
        lines.append(f"- {r['backend']}: " + ", ".join(f"{layout_label(r, n)} {x['seconds']:.2f}"
                                                        for n, x in r["layouts"].items()))
    lines += ["", "| backend | ES generation per repeat (s) | spread | pure inference per repeat (s) | spread |",
              "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {', '.join(f'{x:.2f}' for x in r['repeats'])} | {spread(r['repeats'])} | "
                     f"{', '.join(f'{x:.2f}' for x in r['floor_repeats'])} | {spread(r['floor_repeats'])} |")
    return lines


def memory_table(memory: list[dict]) -> list[str]:
    lines = ["Peak memory (RSS; each in a fresh process with glibc's mmap threshold fixed; inference-only: one call of "
             "the backend's rows per rollout, no ES). With several repeats: the median, then every repeat (ES, "
             "inference, ratio) in order:", "",
             "| backend | rows per rollout | peak | inference-only peak | ratio | repeats |",
             "|---|---|---|---|---|---|"]
    for m in memory:  # "peak" and "inference_peak" are the medians of the repeats
        peak, inf = m["peak"], m["inference_peak"]
        pairs = list(zip(m["peaks"], m["inference_peaks"]))
        each = "; ".join(f"{fmt_mib(a)} / {fmt_mib(b)} = {a / b:.3f}" for a, b in pairs if a and b)
        lines.append(f"| {m['backend']} | {m['rollout_batch']} | {fmt_mib(peak)} | {fmt_mib(inf)} | "
                     f"{peak / inf if peak and inf else float('nan'):.3f} | {each if len(pairs) > 1 else '-'} |")
    return lines


def report(result: dict) -> str:
    lines = [*main_table(result), "", *gap_table(result["rows"]), "", *repeats_table(result["rows"])]
    if result.get("memory"):
        lines += ["", *memory_table(result["memory"])]
    return "\n".join(lines) + "\n"


# --- memory, each in a fresh process --------------------------------------------------------------------

def memory_child(args: argparse.Namespace) -> int:
    """In a fresh process: one generation of a backend, then its peak memory on stdout (JSON)."""
    from esopt.train.models import load_model
    from esopt.utils.memory import peak_memory_bytes

    config = backend_config(args, args.memory_child)
    policy = load_model(config.model, config.env.kwargs)
    one_generation(config, policy, noise=False, progress=False)
    print(json.dumps({"peak": peak_memory_bytes(policy.device)}))
    return 0


def measure_memory(args: argparse.Namespace, argv: list[str], log) -> list[dict]:
    """Each backend's peak and inference alone's, `--memory-repeats` times each (fresh processes, alternating,
    both with glibc's mmap threshold fixed so that a peak RSS is live memory, not heap history)."""
    from esopt.train.memprobe import inference_peak_bytes
    from esopt.utils.memory import steady_malloc_env

    env = steady_malloc_env()

    out = []
    for key in args.backends:
        config = backend_config(args, key)
        peaks, inference = [], []
        for r in range(args.memory_repeats):
            log(f"peak memory: {BACKENDS[key]} and inference alone ({config.rollout_batch_size} episodes), fresh "
                f"processes, repeat {r + 1}/{args.memory_repeats}")
            cmd = [sys.executable, "-m", "esopt.experiments.efficiency", *argv, "--memory-child", key]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            peak = json.loads(res.stdout.strip().splitlines()[-1])["peak"] if res.returncode == 0 else None
            if peak is None:
                log(f"warning: the memory run of {BACKENDS[key]} failed: {res.stderr.strip().splitlines()[-1:]}")
            peaks.append(peak)
            inference.append(inference_peak_bytes(config, config.rollout_batch_size, env))
        ok = [p for p in peaks if p is not None]
        inf = [p for p in inference if p is not None]
        out.append({"backend": BACKENDS[key], "peak": statistics.median(ok) if ok else None,
                    "inference_peak": statistics.median(inf) if inf else None, "peaks": peaks,
                    "inference_peaks": inference, "rollout_batch": config.rollout_batch_size})
    return out


def measure(args: argparse.Namespace, log) -> dict:
    from esopt.train.evaluate import rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory

    config = backend_config(args, args.backends[0])
    policy = load_model(config.model, config.env.kwargs)
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    make = env_factory(config)
    rollout_spec(config, make).run(policy, make, [0], seed=0)  # warm-up: kernels, allocator, tokenizer
    rows = [measure_backend(key, args, policy, base, log) for key in args.backends]
    return {"model": config.model.name, "dtype": config.model.resolved_dtype, "config": str(args.config),
            "params": sum(p.numel() for p in policy.model.parameters()), "members": args.members,
            "tasks": args.tasks, "threads": torch.get_num_threads(), "device": str(policy.device),
            "repeats": args.repeats, "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt bench efficiency", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/demo.yaml", help="training config (default: the demo's Sudoku)")
    p.add_argument("--model", choices=["tiny", "smollm2"], default=None, help="default: the config's model")
    p.add_argument("--members", type=int, default=32, help="G (even: antithetic pairs)")
    p.add_argument("--tasks", type=int, default=4, help="E: tasks per member")
    p.add_argument("--repeats", type=int, default=2, help="generations per backend (the best is reported)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: every core this process may use)")
    p.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    p.add_argument("--floor-batches", nargs="*", type=int, default=[64, 256], metavar="B",
                   help="fixed batch sizes pure inference also tries over all rows")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory processes")
    p.add_argument("--memory-repeats", type=int, default=1,
                   help="fresh-process peak measurements per backend and of inference alone (medians reported)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--out", default=None, help="also write OUT/efficiency.md and .json")
    p.add_argument("--memory-child", choices=list(BACKENDS), help=argparse.SUPPRESS)
    return p


def check_args(args: argparse.Namespace) -> None:
    if args.members < 2 or args.members % 2:
        raise ValueError(f"--members must be an even number >= 2 (antithetic pairs), got {args.members}")
    for name in ("tasks", "repeats", "threads", "memory_repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if any(b < 1 for b in args.floor_batches):
        raise ValueError(f"--floor-batches must be >= 1, got {args.floor_batches}")
    if any(s.partition("=")[0] == "max_batch_size" for s in args.set):
        raise ValueError("--set max_batch_size: the bench needs one generate call per turn (max_batch_size null)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if args.memory_child:
        return memory_child(args)
    from esopt.utils.progress import interactive

    args.progress = not args.quiet and interactive()  # the members bar of the local evaluator

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    backend_config(args, args.backends[0])  # a bad config or override fails now, in one line
    result = measure(args, log)
    if args.memory:
        result["memory"] = measure_memory(args, argv, log)
    if args.out:
        write_report(args.out, "efficiency", report(result), result)
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
