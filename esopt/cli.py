"""`esopt`: train, eval, replay, pretrain, demo, bench, analyze.

Every subcommand prints a one-line error (exit code 2) for bad input instead of a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

EXAMPLES = """examples:
  esopt train configs/smoke.yaml --out runs/smoke
  esopt train configs/sudoku4_h10_cpu.yaml es.sigma=2e-3 env.kwargs.h_star=15
  esopt train --resume runs/smoke
  esopt eval --model tiny-sudoku --size 4 --h-star 10 --episodes 64
  esopt eval --model smollm2 --env-kwargs '{"size": 4, "h_star": 1, "hints": "empty"}' --few-shot 2
  esopt replay runs/smoke --out runs/smoke-replayed
  esopt demo
"""


def _train(args: argparse.Namespace) -> int:
    from esopt.train.config import load_config

    if args.workers is not None:
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        args.overrides = [*args.overrides, "distributed.backend=ray", f"distributed.workers={args.workers}"]

    if args.resume:
        run = Path(args.resume)
        if not (run / "config.yaml").exists():
            raise ValueError(f"--resume {run}: no config.yaml there (not a run directory)")
        if args.config:  # `--resume RUN steps=100`: the first override lands in the CONFIG slot
            if "=" not in args.config:
                raise ValueError(f"--resume takes its config from {run / 'config.yaml'}; drop {args.config!r} "
                                 "(overrides such as steps=100 are allowed)")
            args.overrides = [args.config, *args.overrides]
        config = load_config(run / "config.yaml", args.overrides)
        out = run
    else:
        if not args.config:
            raise ValueError("train needs a CONFIG file (or --resume RUN_DIR)")
        config = load_config(args.config, args.overrides)
        out = Path(args.out or f"runs/{config.algo}-{time.strftime('%Y%m%d-%H%M%S')}")
    from esopt.envs import make_env

    make_env(config.env.id, **config.env.kwargs).close()  # bad env settings: a one-line error, before torch loads
    from esopt.train import trainer as trainer_of

    trainer = trainer_of(config.algo)
    summary = trainer(config, out, resume=bool(args.resume), progress=not args.no_progress)
    print(f"run directory: {out}")
    return 130 if summary.get("interrupted") else 0


def _eval(args: argparse.Namespace) -> int:
    from esopt.engines.base import SamplingParams
    from esopt.rollout import env_examples, run_episodes, summarize
    from esopt.train.config import ModelSection
    from esopt.train.models import load_model

    env_kwargs = _env_kwargs(args)
    from esopt.envs import make_env

    make_env(args.env, **env_kwargs).close()  # a bad env id or argument fails before the model loads
    policy = load_model(ModelSection(name=args.model, dtype=args.dtype, device=args.device), env_kwargs)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens)
    if args.rollouts_per_task < 1:
        raise ValueError(f"--rollouts-per-task must be >= 1, got {args.rollouts_per_task}")
    if args.rollouts_per_task > 1 and args.temperature == 0:
        raise ValueError("--rollouts-per-task > 1 needs sampling (--temperature > 0): greedy rollouts are identical")
    seeds = [args.task_seed + i for i in range(args.episodes)] * args.rollouts_per_task  # sample-major
    with make_env(args.env, **env_kwargs) as env:
        examples = env_examples(env, args.few_shot)
    trajectories, stats = run_episodes(
        policy, lambda: make_env(args.env, **env_kwargs), seeds, sampling, seed=args.seed,
        conversation=args.conversation, max_batch_size=args.batch_size, progress=not args.no_progress,
        examples=examples)
    s = summarize(trajectories)
    dtype = next(policy.model.parameters()).dtype
    print(f"model {args.model} ({str(dtype).removeprefix('torch.')}) | {args.env} {env_kwargs} | {args.few_shot} "
          f"worked examples | {args.episodes} episodes | T={args.temperature}")
    print(f"success rate {s['success_rate']:.3f} | mean reward {s['mean_reward']:.3f} | mean turns "
          f"{s['mean_turns']:.2f} | valid actions {s['valid_action_rate']:.3f} | "
          f"correct given valid {s['correct_given_valid']:.3f} | "
          f"{stats.tokens_per_second:.1f} generated tok/s ({stats.generated_tokens} tokens in {stats.seconds:.1f}s)")
    if args.rollouts_per_task > 1:
        from esopt.testtime import summarize_test_time

        tt = summarize_test_time(trajectories, args.rollouts_per_task)
        print(f"test-time compute over {args.rollouts_per_task} rollouts per task: "
              + " | ".join(f"{k} {v:.3f}" for k, v in tt.items()))
    for t in trajectories[: args.samples]:
        print(f"\n--- task {t.task_seed}: success={t.success} turns={t.num_turns} reward={t.reward:.2f}")
        for k, turn in enumerate(t.turns[:6]):
            print(f"[turn {k + 1}] prompt tail: {turn.prompt[-80:]!r}")
            print(f"          action: {turn.text!r} -> {turn.info.get('feedback', '')!r}")
        if t.num_turns > 6:
            print(f"          ... {t.num_turns - 6} more turns")
    return 0


def _env_kwargs(args: argparse.Namespace) -> dict:
    """--env-kwargs JSON, then the Sudoku shortcuts (--size, --h-star, --reward) when the env is Sudoku,
    then --env-arg KEY=VALUE pairs."""
    import json

    import yaml

    try:
        kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"--env-kwargs is not valid JSON: {e}") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    if args.env == "esopt/Sudoku-v0":
        shortcuts = {"size": args.size or 4, "h_star": args.h_star or 5, "reward": args.reward}
        kwargs = {**{k: v for k, v in shortcuts.items() if v is not None}, **kwargs}
    elif any(v is not None for v in (args.size, args.h_star, args.reward)):
        raise ValueError(f"--size, --h-star and --reward are Sudoku options; pass {args.env}'s arguments "
                         "with --env-kwargs JSON")
    for pair in args.env_arg or []:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"--env-arg {pair!r} must look like key=value")
        kwargs[key] = yaml.safe_load(raw)
    return kwargs


def _replay(args: argparse.Namespace) -> int:
    from esopt.es import read_history, replay
    from esopt.train.config import load_config
    from esopt.train.models import load_model
    from esopt.utils.io import save_pretrained_atomic

    run = Path(args.run_dir)
    config = load_config(run / "config.yaml")
    records = read_history(run / "history.jsonl")
    policy = load_model(config.model, config.env.kwargs)
    t = time.perf_counter()
    replay(policy.model, records, upto=args.upto)
    save_pretrained_atomic(policy.model, policy.tokenizer, args.out)
    n = len(records) if args.upto is None else min(args.upto, len(records))
    print(f"replayed {n} generations in {time.perf_counter() - t:.1f}s -> {args.out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401

        from esopt.serve import serve
    except ImportError:
        raise ValueError("esopt serve needs the serve extra: pip install 'agentic-esopt[serve]'") from None
    serve(args.model, host=args.host, port=args.port, dtype=args.dtype, device=args.device, max_batch=args.max_batch,
          served_model_name=args.served_model_name, prompt=not args.no_prompt, wait_ms=args.wait_ms)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from esopt.demo import run_demo
    from esopt.utils.memory import steady_malloc_active, steady_malloc_env

    if not steady_malloc_active():
        # glibc reads its malloc settings at start-up: start again with them, so that the printed peak ratio is
        # of live memory (under glibc's defaults three demos printed 0.95, 1.04 and 1.33)
        flags = [f for f, on in (("--quick", args.quick), ("--tiny", args.tiny)) if on]
        argv = ["demo", "--out", str(args.out), *flags]
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "esopt.cli", *argv], steady_malloc_env())
    return run_demo(out=args.out, quick=args.quick, tiny=args.tiny)


def _pretrain(args: argparse.Namespace) -> int:
    from esopt.train.sft import main_pretrain

    return main_pretrain(args.rest)


def _bench(args: argparse.Namespace) -> int:
    from esopt.experiments import run

    return run("bench", args.which, args.rest)


def _analyze(args: argparse.Namespace) -> int:
    from esopt.experiments import run

    return run("analyze", args.which, args.rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="esopt", description="Evolution strategies for multi-turn LLM agents.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train from a YAML config (es, grpo or ppo)",
                       description="Train from a YAML config. Override any field with dotted key=value pairs.")
    t.add_argument("config", nargs="?", help="YAML config (see configs/)")
    t.add_argument("overrides", nargs="*", help="field overrides, e.g. es.sigma=2e-3 env.kwargs.h_star=15")
    t.add_argument("--out", help="run directory (default runs/ALGO-TIMESTAMP)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last complete generation")
    t.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")
    t.add_argument("--workers", type=int, help="ES: evaluate the population on N Ray workers (distributed.backend=ray)")
    t.set_defaults(func=_train)

    _add_eval(sub)
    _add_serve_and_demo(sub)
    _add_passthrough(sub)
    return p


def _add_eval(sub) -> None:
    e = sub.add_parser("eval", help="roll out a model on an env and print success, reward, turns, tokens/s")
    e.add_argument("--model", default="tiny", help="tiny | tiny-sudoku | smollm2 | local HF dir | .gguf file")
    e.add_argument("--env", default="esopt/Sudoku-v0", help="registered env id")
    e.add_argument("--env-kwargs", metavar="JSON", help='env arguments as a JSON object, e.g. \'{"size": 4}\'')
    e.add_argument("--size", type=int, help="Sudoku: board size 4, 6 or 9 (default 4)")
    e.add_argument("--h-star", type=int, help="Sudoku: holes = minimum turns to succeed (default 5)")
    e.add_argument("--reward", choices=["binary", "shaped"], help="Sudoku: env reward (default binary)")
    e.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                   help="extra env argument (repeatable), e.g. --env-arg hints=candidates")
    e.add_argument("--episodes", type=int, default=32, help="tasks (one episode each unless --rollouts-per-task)")
    e.add_argument("--rollouts-per-task", type=int, default=1,
                   help="N > 1: test-time compute, reports Mean@N, Pass@k, best-of-N (env verifier) and vote@N")
    e.add_argument("--task-seed", type=int, default=10_000, help="first task seed (tasks are seed..seed+N-1)")
    e.add_argument("--seed", type=int, default=0, help="sampling seed")
    e.add_argument("--temperature", type=float, default=0.7)
    e.add_argument("--top-p", type=float, default=0.8)
    e.add_argument("--top-k", type=int, default=20)
    e.add_argument("--max-new-tokens", type=int, default=16)
    e.add_argument("--conversation", choices=["markov", "history"], default="markov")
    e.add_argument("--batch-size", type=int, default=None, help="max episodes per generate call")
    e.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="auto: bfloat16 for smollm2 where the hardware has bf16, float32 otherwise")
    e.add_argument("--few-shot", type=int, default=0, help="worked exchanges from the env shown as chat turns")
    e.add_argument("--device", default="cpu")
    e.add_argument("--samples", type=int, default=2, help="transcripts to print")
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=_eval)


def _add_serve_and_demo(sub) -> None:  # and replay
    r = sub.add_parser("replay", help="rebuild a run's weights from its base model and history.jsonl")
    r.add_argument("run_dir")
    r.add_argument("--out", required=True, help="where to write the rebuilt HF model")
    r.add_argument("--upto", type=int, help="replay only the first N generations")
    r.set_defaults(func=_replay)

    sv = sub.add_parser("serve", help="an OpenAI-compatible chat endpoint for a model or checkpoint (loopback)")
    sv.add_argument("model", help="tiny | smollm2 | a local HF dir (e.g. RUN/final) | a .gguf file")
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    sv.add_argument("--device", default="cpu")
    sv.add_argument("--max-batch", type=int, default=32, help="rows (prompts x n) in one generate call at most")
    sv.add_argument("--wait-ms", type=float, default=5.0, help="how long a request waits for others to batch with")
    sv.add_argument("--served-model-name", help="the model name clients use (default: MODEL as given)")
    sv.add_argument("--no-prompt", action="store_true",
                    help="serve the bare weights, without the run's prompt program (system prompt, worked examples)")
    sv.set_defaults(func=_serve)

    d = sub.add_parser("demo", help="the README's main job: ES fine-tunes SmolLM2 on Sudoku, before/after table")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--quick", action="store_true", help="a one-minute version (smoke)")
    d.add_argument("--tiny", action="store_true",
                   help="the warm-started tiny model instead of SmolLM2: the machinery only (it shows no gain)")
    d.set_defaults(func=_demo)


def _add_passthrough(sub) -> None:
    """Sub-commands with their own argument parsers: everything after the name goes to them."""
    from esopt.experiments import ANALYSES, BENCHMARKS

    pt = sub.add_parser("pretrain", help="supervised warm start of the tiny model (see esopt pretrain -h)",
                        add_help=False)
    pt.add_argument("rest", nargs=argparse.REMAINDER)
    pt.set_defaults(func=_pretrain)

    b = sub.add_parser("bench", help=f"benchmarks: {' | '.join(BENCHMARKS)} (pass -h after the name)")
    b.add_argument("which")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=_bench)

    a = sub.add_parser("analyze", help=f"analyses: {' | '.join(ANALYSES)} (pass -h after the name)")
    a.add_argument("which")
    a.add_argument("rest", nargs=argparse.REMAINDER)
    a.set_defaults(func=_analyze)


# sub-commands with their own argument parser: everything after the name goes to it verbatim
# (argparse's REMAINDER drops a leading option such as `pretrain --seconds 60`)
PASSTHROUGH = {"pretrain": 0, "bench": 1, "analyze": 1}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in PASSTHROUGH and "-h" not in argv[: 1 + PASSTHROUGH[argv[0]]]:
        head = 1 + PASSTHROUGH[argv[0]]
        args = parser.parse_args(argv[:head])
        args.rest = argv[head:]
        extra: list[str] = []
    else:
        args, extra = parser.parse_known_args(argv)
    if extra:  # overrides may follow options: `train CFG --out DIR es.sigma=2e-3`
        if args.command == "train" and all("=" in x and not x.startswith("-") for x in extra):
            args.overrides = list(args.overrides) + extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from esopt.utils.progress import interactive, quiet_libraries

    if getattr(args, "no_progress", False) or not interactive():
        quiet_libraries()  # no shard/weight-loading bars in logs
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"esopt {args.command}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
