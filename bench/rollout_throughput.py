"""Rollout engine throughput vs raw batched `model.generate` on the same prompts.

Both sides use the same model, batch size, sampling settings and max_new_tokens. The engine runs
`--turns` lockstep Sudoku turns (env steps, prompt building, bookkeeping included); the raw side runs
`--turns` plain `model.generate` calls on the engine's first-turn prompts. Generated tokens are counted
the same way (up to and including the first EOS). Runs are interleaved and the median is reported.

    python bench/rollout_throughput.py --model tiny --batch 32 --turns 4
    esopt bench rollout --model smollm2 --batch 32 --turns 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch

from esopt.policies import HFPolicy, SamplingParams, load_policy
from esopt.rollout import build_markov_prompt, run_episodes


def _make_env_factory(size: int, h_star: int):
    import esopt.envs  # noqa: F401  (registers esopt/Sudoku-v0)

    def make() -> gym.Env:
        return gym.make("esopt/Sudoku-v0", size=size, h_star=h_star)

    return make


def first_prompts(policy: HFPolicy, make, seeds: list[int]) -> list[str]:
    prompts = []
    for s in seeds:
        env = make()
        obs, _ = env.reset(seed=s)
        prompts.append(build_markov_prompt(policy, env.unwrapped.instructions, obs))
        env.close()
    return prompts


@torch.inference_mode()
def raw_generate(policy: HFPolicy, prompts: list[str], sampling: SamplingParams, turns: int, seed: int):
    """(generated tokens, seconds) of `turns` plain batched model.generate calls."""
    model, tok = policy.model, policy.tokenizer
    eos = policy.eos_token_ids
    kwargs = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    if sampling.greedy:
        kwargs["do_sample"] = False
    else:
        kwargs.update(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k
        )
    tokens, start = 0, time.perf_counter()
    for t in range(turns):
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
        torch.manual_seed(seed + t)
        out = model.generate(**enc, **kwargs)
        new = out[:, enc["input_ids"].shape[1] :]
        is_eos = torch.isin(new, torch.tensor(eos, device=new.device))
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])
        tokens += int(lengths.sum())
    return tokens, time.perf_counter() - start


def engine_generate(
    policy: HFPolicy, make, seeds: list[int], sampling: SamplingParams, turns: int, seed: int
):
    """(generated tokens, seconds) of a `turns`-turn lockstep rollout."""
    _, stats = run_episodes(policy, make, seeds, sampling, seed=seed, max_turns=turns)
    return stats.generated_tokens, stats.seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="esopt bench rollout", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a local model dir | a .gguf file")
    ap.add_argument("--batch", type=int, default=32, help="episodes (= prompts per generate call)")
    ap.add_argument("--turns", type=int, default=4, help="turns (engine) / generate calls (raw) per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats; the median is reported")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--size", type=int, default=4, help="Sudoku size")
    ap.add_argument("--h-star", type=int, default=10, help="empty cells (turn cap 3*H* >= --turns)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    policy = load_policy(args.model, dtype=args.dtype, device=args.device)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens)
    make = _make_env_factory(args.size, args.h_star)
    seeds = list(range(args.batch))
    prompts = first_prompts(policy, make, seeds)
    # warm-up (allocator, lazy init) for both paths
    raw_generate(policy, prompts, SamplingParams(max_new_tokens=2), 1, 0)
    engine_generate(policy, make, seeds, SamplingParams(max_new_tokens=2), 1, 0)

    raw_tps, eng_tps = [], []
    for r in range(args.repeats):
        n, s = raw_generate(policy, prompts, sampling, args.turns, seed=r)
        raw_tps.append(n / s)
        n, s = engine_generate(policy, make, seeds, sampling, args.turns, seed=r)
        eng_tps.append(n / s)
        print(f"repeat {r}: raw {raw_tps[-1]:.0f} tok/s, engine {eng_tps[-1]:.0f} tok/s", flush=True)
    raw, eng = statistics.median(raw_tps), statistics.median(eng_tps)
    params = sum(p.numel() for p in policy.model.parameters())
    print(
        f"\nmodel {args.model} ({params / 1e6:.1f}M params, {args.dtype}, {policy.device}), batch {args.batch}, "
        f"{args.turns} turns, max_new_tokens {args.max_new_tokens}, T={args.temperature}, threads "
        f"{torch.get_num_threads()}"
    )
    print(f"{'raw model.generate':>22} {'rollout engine':>16} {'ratio':>7}")
    print(f"{raw:>16.0f} tok/s {eng:>10.0f} tok/s {eng / raw:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
