"""Rollout engine throughput vs raw batched `model.generate` on the same prompts.

Both sides use the same model, batch size, sampling settings and max_new_tokens. The engine runs
`--turns` lockstep Sudoku turns (env creation, env steps, prompt building, bookkeeping included), with
`--few-shot` worked examples in every prompt; it encodes the prompts' shared prefix once per call
(`esopt/policies/prefix.py`). The raw side then replays exactly the engine's per-turn prompt batches
through plain `model.generate` with the same per-turn seeds (every row encodes its whole prompt), so
both generate the same tokens (checked; bf16 may flip a rare near-tie) and the ratio is what the engine
gains or loses. Prompt tokens/s counts every prompt's full length, new tokens/s the generated tokens up
to and including the first EOS. Reports the best of the interleaved repeats per side. The engine also runs
without its row cache (each row's own KV kept from turn to turn), which a `--conversation history` rollout, whose
prompts grow by the last reply and observation, gains most from.

    python bench/rollout_throughput.py --model tiny --batch 32 --turns 4
    esopt bench rollout --model smollm2 --batch 64 --turns 2 --few-shot 2
    esopt bench rollout --model smollm2 --batch 32 --turns 6 --few-shot 2 --conversation history
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Literal

import gymnasium as gym
import torch

from esopt.engines.base import SamplingParams
from esopt.engines.hf import HFEngine
from esopt.models import load_policy
from esopt.rollout import env_examples, run_episodes, turn_seed


def _make_env_factory(size: int, h_star: int, show_empty: bool = False):
    import esopt.envs  # noqa: F401  (registers esopt/Sudoku-v0)

    def make() -> gym.Env:
        return gym.make("esopt/Sudoku-v0", size=size, h_star=h_star, show_empty=show_empty)

    return make


@torch.inference_mode()
def raw_generate(
    policy: HFEngine, turn_prompts: list[list[str]], sampling: SamplingParams, seed: int
) -> tuple[int, float, list[list[int]]]:
    """(generated tokens, seconds, token ids) of one plain batched model.generate call per prompt batch."""
    model, tok = policy.model, policy.tokenizer
    eos = policy.eos_token_ids
    kwargs = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    if sampling.greedy:
        kwargs["do_sample"] = False
    else:
        kwargs.update(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k
        )
    tokens, ids, start = 0, [], time.perf_counter()
    for t, prompts in enumerate(turn_prompts):
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
        torch.manual_seed(turn_seed(seed, t, 0))
        out = model.generate(**enc, **kwargs)
        new = out[:, enc["input_ids"].shape[1] :]
        is_eos = torch.isin(new, torch.tensor(eos, device=new.device))
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])
        tokens += int(lengths.sum())
        ids += [row[:n] for row, n in zip(new.tolist(), lengths.tolist())]
    return tokens, time.perf_counter() - start, ids


def engine_generate(
    policy: HFEngine, make, seeds: list[int], sampling: SamplingParams, turns: int, seed: int, examples=(),
    conversation: Literal["markov", "history"] = "markov",
) -> tuple[int, float, list[list[str]], list[list[int]]]:
    """(generated tokens, seconds, prompts per turn, token ids) of a `turns`-turn lockstep rollout."""
    trajs, stats = run_episodes(policy, make, seeds, sampling, seed=seed, max_turns=turns, examples=examples,
                                conversation=conversation)
    turn_prompts = [[tr.turns[t].prompt for tr in trajs if len(tr.turns) > t] for t in range(turns)]
    ids = [tr.turns[t].token_ids for t in range(turns) for tr in trajs if len(tr.turns) > t]
    return stats.generated_tokens, stats.seconds, [p for p in turn_prompts if p], ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="esopt bench rollout", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a local model dir | a .gguf file")
    ap.add_argument("--batch", type=int, default=32, help="episodes (= prompts per generate call)")
    ap.add_argument("--turns", type=int, default=4, help="turns (engine) / generate calls (raw) per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats (best and median reported)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--size", type=int, default=4, help="Sudoku size")
    ap.add_argument("--h-star", type=int, default=10, help="empty cells (turn cap 3*H* >= --turns)")
    ap.add_argument("--few-shot", type=int, default=0, help="worked examples in every prompt (shared prefix)")
    ap.add_argument("--show-empty", action="store_true", help="Sudoku observation lists the empty cells")
    ap.add_argument("--conversation", choices=["markov", "history"], default="markov",
                    help="markov: each prompt shows the current board; history: the whole episode so far")
    ap.add_argument("--dtype", default="auto", help="auto: bf16 for smollm2 where the hardware has it, else fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    policy = load_policy(args.model, dtype=args.dtype, device=args.device)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens)
    make = _make_env_factory(args.size, args.h_star, args.show_empty)
    with make() as env:
        examples = env_examples(env, args.few_shot)
    seeds = list(range(args.batch))
    # warm-up (allocator, lazy init) for both paths
    engine_generate(policy, make, seeds, SamplingParams(max_new_tokens=2), 1, 0, examples)

    raw_runs, eng_runs, flat_runs, same, same_flat = [], [], [], 0, 0
    for r in range(args.repeats):
        row_kv, policy.row_kv = policy.row_kv, None
        n, s, _, flat_ids = engine_generate(policy, make, seeds, sampling, args.turns, seed=r, examples=examples,
                                            conversation=args.conversation)
        flat_runs.append(s)
        policy.row_kv = row_kv
        n, s, turn_prompts, eng_ids = engine_generate(policy, make, seeds, sampling, args.turns, seed=r,
                                                      examples=examples, conversation=args.conversation)
        same_flat += sum(a == b for a, b in zip(flat_ids, eng_ids))
        prompt_tokens = sum(len(policy.tokenizer(p, add_special_tokens=False)["input_ids"])
                            for batch in turn_prompts for p in batch)
        eng_runs.append((prompt_tokens / s, n / s, s))
        # the raw side replays exactly the engine's prompt batches with the same per-turn seeds
        n_raw, s_raw, raw_ids = raw_generate(policy, turn_prompts, sampling, seed=r)
        raw_runs.append((prompt_tokens / s_raw, n_raw / s_raw, s_raw))
        same += sum(a == b for a, b in zip(raw_ids, eng_ids))
        print(f"repeat {r}: raw {s_raw:.1f}s, engine {s:.1f}s, engine without row cache {flat_runs[-1]:.1f}s",
              flush=True)
    # best-of is the least disturbed by other load on the machine; the median ratio pairs runs back to back
    raw, eng = min(raw_runs, key=lambda x: x[2]), min(eng_runs, key=lambda x: x[2])
    ratio_median = statistics.median(r[2] / e[2] for e, r in zip(eng_runs, raw_runs))
    params = sum(p.numel() for p in policy.model.parameters())
    print(
        f"\nmodel {args.model} ({params / 1e6:.1f}M params, {next(policy.model.parameters()).dtype}, "
        f"{policy.device}), batch {args.batch}, {args.turns} turns, {args.few_shot} worked examples, "
        f"{prompt_tokens / (args.batch * len(turn_prompts)):.0f} prompt tokens per row, max_new_tokens "
        f"{args.max_new_tokens}, T={args.temperature}, {args.conversation} prompts, threads {torch.get_num_threads()}"
    )
    print(f"{'':>24} {'prompt tok/s':>13} {'new tok/s':>10} {'seconds':>8}")
    print(f"{'raw model.generate':>24} {raw[0]:>13.0f} {raw[1]:>10.1f} {raw[2]:>8.2f}")
    print(f"{'rollout engine':>24} {eng[0]:>13.0f} {eng[1]:>10.1f} {eng[2]:>8.2f}")
    print(f"{'engine, no row cache':>24} {'':>13} {'':>10} {min(flat_runs):>8.2f}")
    print(f"engine speed-up (raw seconds / engine seconds): {raw[2] / eng[2]:.2f}x best of {args.repeats}, "
          f"median per repeat {ratio_median:.2f}x")
    total = args.repeats * sum(len(b) for b in turn_prompts)
    print(f"row cache speed-up (engine without / with it): {min(flat_runs) / eng[2]:.2f}x best of {args.repeats}")
    print(f"identical token ids (engine vs raw): {same}/{total} rows; engine with vs without row cache: "
          f"{same_flat}/{total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
