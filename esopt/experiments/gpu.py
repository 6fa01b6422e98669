"""`esopt bench gpu`: ES generation wall-clock against pure batched inference of the same tokens, on
randomly initialised models of real shapes (no weights downloaded, no network).

For each shape: G members, each decoding the same batch of B random prompts (P prompt tokens, N new tokens,
EOS disabled so every row makes exactly N tokens):
- `inference`: G plain batched `generate` calls (what the tokens cost without ES, one member's batch per call);
- `inference, one call`: all G x B rows in one `generate` (the best layout pure inference has: the floor);
- `full-rank`: per member perturb (dense noise) -> generate -> restore, then the update;
- `low-rank in place`: the same with rank-r noise written into the weights;
- `full-rank batched`: all G x B rows in one `generate`, each row on its member's dense perturbed copy (built
  first: its time is the perturb column);
- `low-rank batched`: all G x B rows in one `generate`, each row adding its member's low-rank term.
It prints perturb / restore / update seconds per member, each mode's time over `inference` and the ratio
best inference / mode (1: ES at the inference limit; the real-rollout counterpart is `esopt bench efficiency`).

    esopt bench gpu                       # SmolLM2-135M and ~1.7B shapes, bf16, on CUDA (~5 min on one H200)
    esopt bench gpu --shapes smollm2 --device cpu --members 4 --batch 8 --new-tokens 8   # a CPU check
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

SHAPES = {  # LlamaConfig fields of SmolLM2-135M and SmolLM2-1.7B (~1.7B parameters)
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=49152, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=512, tie_word_embeddings=True),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(shape: str, dtype: torch.dtype, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    with torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(dtype).eval()
    return model


ES_MODES = ("full-rank", "full-rank batched", "low-rank in place", "low-rank batched")


def time_in_place(es, decode, ids: torch.Tensor, members: int, batch: int, device: torch.device) -> dict:
    """One generation member by member: perturb in place, decode the batch, restore; then the update."""
    split = {"perturb": 0.0, "restore": 0.0, "update": 0.0}
    sync(device)
    t0 = time.perf_counter()
    for member in es.ask(0):
        t = time.perf_counter()
        with es.perturbed(member):
            sync(device)
            split["perturb"] += time.perf_counter() - t
            decode(ids)
            t = time.perf_counter()
        sync(device)
        split["restore"] += time.perf_counter() - t
    t = time.perf_counter()
    es.tell([float(i % 3) for i in range(members)])
    sync(device)
    split["update"] += time.perf_counter() - t
    return {"seconds": time.perf_counter() - t0, **{k: v / members for k, v in split.items()}}


def time_batched(es, decode, ids: torch.Tensor, members: int, batch: int, device: torch.device) -> dict:
    """All members' rows in one generate, as batched training runs them (`es` without an fp32 master): low-rank
    terms added per row, or each member's dense copy built first (that build is the perturb column); then the
    update."""
    from esopt.es.batched import member_router

    host = member_router(es.model, es.perturbation)
    pop = es.ask(1)
    sync(device)
    t0 = time.perf_counter()
    with host.members(pop, es.config.sigma):
        sync(device)
        built = time.perf_counter() - t0
        host.set_rows([i for i in range(members) for _ in range(batch)])
        decode(ids.repeat(members, 1))
    t = time.perf_counter()
    es.tell([float(i % 3) for i in range(members)])
    sync(device)
    return {"seconds": time.perf_counter() - t0, "restore": None, "update": (time.perf_counter() - t) / members,
            "perturb": built / members if es.config.noise == "normal" else None}


def measure(shape: str, members: int, batch: int, prompt_tokens: int, new_tokens: int, rank: int,
            dtype: torch.dtype, device: torch.device, modes: tuple[str, ...] = ES_MODES) -> dict:
    from esopt.es import ES, ESConfig

    model = build(shape, dtype, device)
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(3, SHAPES[shape]["vocab_size"], (batch, prompt_tokens), generator=gen).to(device)

    @torch.inference_mode()
    def decode(rows: torch.Tensor) -> None:
        model.generate(input_ids=rows, attention_mask=torch.ones_like(rows), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

    # warm-up of both layouts, untimed: on a GPU the first call of a shape pays for kernel choice, allocator
    # growth and clock ramp-up (measured on an H200 without it: "one call" 4.0 s, the same call later 2.6 s)
    decode(ids)
    decode(ids.repeat(members, 1))
    sync(device)
    t = time.perf_counter()
    for _ in range(members):
        decode(ids)
    sync(device)
    rows = [{"mode": "inference", "seconds": time.perf_counter() - t}]
    t = time.perf_counter()
    decode(ids.repeat(members, 1))
    sync(device)
    rows.append({"mode": "inference, one call", "seconds": time.perf_counter() - t})
    master = "cpu" if device.type == "cpu" else str(device)
    for mode in modes:
        batched = mode.endswith("batched")  # as batched training runs: no fp32 master
        config = ESConfig(population_size=members, antithetic=True, sigma=1e-3, sigma_schedule="constant",
                          alpha=1e-4, noise="normal" if mode.startswith("full") else "lowrank", noise_rank=rank,
                          master_device=master, restore="none" if batched else "auto")
        timer = time_batched if batched else time_in_place
        rows.append({"mode": mode, **timer(ES(model, config), decode, ids, members, batch, device)})
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"shape": shape, "params": params, "rows": rows}


def report(results: list[dict], args) -> str:
    lines = [
        f"{args.members} members x {args.batch} rows, {args.prompt_tokens} prompt + {args.new_tokens} new tokens, "
        f"{args.dtype}, {args.device}, rank {args.rank}",
        "",
        "| shape | params | mode | seconds per generation | x inference | best inference / mode | "
        "perturb / restore / update per member (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        base = r["rows"][0]["seconds"]
        best = min(row["seconds"] for row in r["rows"] if row["mode"].startswith("inference"))
        for row in r["rows"]:
            split = " / ".join("-" if row.get(k) is None else f"{row[k]:.4f}" for k in ("perturb", "restore", "update"))
            lines.append(f"| {r['shape']} | {r['params'] / 1e6:.0f}M | {row['mode']} | {row['seconds']:.2f} | "
                         f"{row['seconds'] / base:.2f} | {best / row['seconds']:.3f} | "
                         f"{split if not row['mode'].startswith('inference') else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="esopt bench gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["smollm2", "1.7b"])
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--device", default="auto", help="auto: cuda when available")
    p.add_argument("--modes", nargs="+", choices=ES_MODES, default=list(ES_MODES),
                   help="ES modes to time beside inference (full-rank batched holds a perturbed copy per member)")
    args = p.parse_args(argv)
    if args.members < 2 or args.members % 2:
        raise ValueError("--members must be an even number >= 2")
    from esopt.engines.hf import resolve_device

    device = resolve_device(args.device)
    args.device = str(device)
    dtype = getattr(torch, args.dtype)
    results = []
    for shape in args.shapes:
        results.append(measure(shape, args.members, args.batch, args.prompt_tokens, args.new_tokens, args.rank,
                               dtype, device, tuple(args.modes)))
        print(report(results[-1:], args), flush=True)
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
