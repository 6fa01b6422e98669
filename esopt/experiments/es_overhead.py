"""ES overhead next to inference, side by side in one run.

For one model: per-member perturb and restore time, per-generation update time (and per member), and
one batched generate call; then the peak memory of an ES step (perturb, generate, restore, update)
over the peak of inference alone (load + the same generate), each phase in a fresh process.

    python bench/es_overhead.py --model tiny            # or: esopt bench overhead --model smollm2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _phase(args: argparse.Namespace) -> dict:
    import torch

    from esopt.engines.base import SamplingParams
    from esopt.es import ES, ESConfig
    from esopt.models import load_policy
    from esopt.utils.memory import peak_memory_bytes

    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy(args.model, dtype=args.dtype, device=args.device)
    obs = "1 12.4\n2 .4.2\n3 3..1\n4 43.1\nok t12"  # a short Sudoku observation
    prompts = [policy.build_prompt([{"role": "user", "content": obs}])] * args.batch
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    out = {"params": sum(p.numel() for p in policy.model.parameters())}
    if args.phase == "infer":
        t = time.perf_counter()
        gens = policy.generate(prompts, sampling, seed=0)
        out["generate_s"] = time.perf_counter() - t
        out["generated_tokens"] = sum(len(g.token_ids) for g in gens)
    else:
        es = ES(policy.model, ESConfig(population_size=args.population, restore=args.restore, sigma=1e-3))
        members = es.ask(0)
        perturb, restore = [], []
        for m in members:
            t0 = time.perf_counter()
            ctx = es.perturbed(m)
            ctx.__enter__()
            t1 = time.perf_counter()
            if m.index == 0:
                policy.generate(prompts, sampling, seed=0)
            t2 = time.perf_counter()
            ctx.__exit__(None, None, None)
            restore.append(time.perf_counter() - t2)
            perturb.append(t1 - t0)
        t = time.perf_counter()
        es.tell(list(range(args.population)))
        out["update_s"] = time.perf_counter() - t
        out["perturb_s"] = sum(perturb) / len(perturb)
        out["restore_s"] = sum(restore) / len(restore)
    out["peak_bytes"] = peak_memory_bytes(args.device)
    return out


def _run_phase(argv: list[str], phase: str, restore: str = "subtract") -> dict:
    cmd = [sys.executable, __file__, *argv, "--phase", phase, "--restore", restore]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"phase {phase} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="esopt bench overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny | smollm2 | local HF dir")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--population", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--phase", choices=["infer", "es"], help=argparse.SUPPRESS)
    p.add_argument("--restore", default="subtract", choices=["subtract", "exact"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.phase:
        print(json.dumps(_phase(args)))
        return 0
    base = [a for a in (argv if argv is not None else sys.argv[1:])]
    infer = _run_phase(base, "infer")
    rows = {mode: _run_phase(base, "es", mode) for mode in ("subtract", "exact")}
    gen_s = infer["generate_s"]
    print(f"model {args.model} ({infer['params'] / 1e6:.2f}M params, {args.dtype}, {args.device}), "
          f"batch {args.batch}, {args.max_new_tokens} new tokens, population {args.population}")
    print(f"one batched generate call: {gen_s * 1e3:9.1f} ms  ({infer['generated_tokens']} tokens)")
    print(f"{'restore':>9} | {'perturb/member':>14} | {'restore/member':>14} | {'update/gen':>10} | "
          f"{'update/member':>13} | {'update/perturb':>14} | {'(p+r+u/G)/generate':>18} | {'peak ES/infer':>13}")
    for mode, r in rows.items():
        per_member_update = r["update_s"] / args.population
        overhead = (r["perturb_s"] + r["restore_s"] + per_member_update) / gen_s
        print(f"{mode:>9} | {r['perturb_s'] * 1e3:11.1f} ms | {r['restore_s'] * 1e3:11.1f} ms | "
              f"{r['update_s'] * 1e3:7.1f} ms | {per_member_update * 1e3:10.1f} ms | "
              f"{per_member_update / r['perturb_s']:14.2f} | {overhead:18.3f} | "
              f"{r['peak_bytes'] / infer['peak_bytes']:13.3f}")
    print(f"peak memory: inference {infer['peak_bytes'] / 2**20:.1f} MiB, ES subtract "
          f"{rows['subtract']['peak_bytes'] / 2**20:.1f} MiB, ES exact {rows['exact']['peak_bytes'] / 2**20:.1f} MiB "
          "(exact keeps an fp32 master copy off the accelerator: in host RAM on CPU-only machines)")
    print("goals: peak ES(subtract)/inference <= 1.05; update/member <= 1 perturb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
