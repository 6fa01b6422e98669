"""Throughput and latency of `esopt serve`: requests/s, tokens/s, time to first token and total latency at
1, 8 and 64 concurrent clients, side by side.

The server runs in this process (uvicorn on a thread, a loopback port picked by the OS) with the model;
the clients are the official `openai` package's `AsyncOpenAI` on this process's main event loop. Each
level sends `--requests` chat requests (greedy, distinct prompts, `--max-tokens` each, streamed with
`stream_options.include_usage` unless `--no-stream`) from `--clients` closed-loop clients: a client sends
its next request when its last reply is complete. Tokens/s counts completion tokens from the replies'
usage. "first token" is the time from sending a request to its first chunk with text (streamed only: a JSON
reply's first token comes with its last). "rows/call" is the mean number of rows of the server's batched
`generate` calls: how much the batcher grouped. Clients and server share one Python process (and its GIL), so
the client side costs the server some CPU; a remote client would see slightly more.

    python -m esopt.experiments.serve_throughput --model tiny
    python -m esopt.experiments.serve_throughput --model smollm2 --max-tokens 32 --requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from esopt.utils.report import cpu_model


def prompts_for(count: int) -> list[str]:
    return [f"Question {i}: what is {i % 17} plus {(i * 7) % 23}? Answer briefly." for i in range(count)]


async def _level(base_url: str, model: str, clients: int, prompts: list[str], max_tokens: int,
                 stream: bool) -> dict:
    import openai

    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    latencies: list[float] = []
    firsts: list[float] = []
    tokens = 0

    async def client(c) -> None:
        nonlocal tokens
        while True:
            try:
                prompt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t = time.perf_counter()
            kwargs = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                          temperature=0)
            if stream:
                reply = await c.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
                usage, first = None, None
                async for chunk in reply:
                    usage = chunk.usage or usage
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter() - t
                if first is not None:
                    firsts.append(first)
            else:
                usage = (await c.chat.completions.create(**kwargs)).usage
            latencies.append(time.perf_counter() - t)
            tokens += usage.completion_tokens if usage else 0

    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600) as c:
        start = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(clients)))
        seconds = time.perf_counter() - start
    return {"requests": len(latencies), "seconds": seconds, "tokens": tokens, "p50": _quantile(latencies, 0.5),
            "p95": _quantile(latencies, 0.95), "first_p50": _quantile(firsts, 0.5),
            "first_p95": _quantile(firsts, 0.95)}


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (nan for none)."""
    if not values:
        return float("nan")
    return float(statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]) \
        if len(values) > 1 and q < 1 else max(values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m esopt.experiments.serve_throughput",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a local model dir (e.g. RUN/final)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64], help="concurrency levels")
    ap.add_argument("--requests", type=int, default=64, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every request")
    ap.add_argument("--max-batch", type=int, default=64, help="the server's rows per generate call at most")
    ap.add_argument("--wait-ms", type=float, default=5.0, help="the server's batching window")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--no-stream", action="store_true", help="plain JSON replies instead of SSE streams")
    args = ap.parse_args(argv)
    try:
        import fastapi  # noqa: F401
        import openai  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"the serve benchmark needs the serve and test extras ({e.name} is missing)") from None
    import torch

    from esopt.models import load_policy, model_dtype
    from esopt.serve import build_app, load_prompt_program, start_in_thread

    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy(args.model, dtype=args.dtype, device=args.device)
    app = build_app(policy, args.model, program=load_prompt_program(args.model), max_batch=args.max_batch,
                    wait_s=args.wait_ms / 1000)
    server = start_in_thread(app)
    batcher = app.state.batcher
    rows = []
    try:
        prompts = prompts_for(args.requests)
        asyncio.run(_level(server.base_url, args.model, 1, prompts[:2], args.max_tokens, not args.no_stream))  # warm-up
        for clients in args.clients:
            calls, generated = batcher.batches, batcher.rows
            r = asyncio.run(_level(server.base_url, args.model, clients, prompts, args.max_tokens, not args.no_stream))
            r["clients"], r["rows_per_call"] = clients, (batcher.rows - generated) / max(1, batcher.batches - calls)
            rows.append(r)
            print(f"  {clients} clients: {r['requests'] / r['seconds']:.2f} req/s", flush=True)
    finally:
        server.stop()
    dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    print(
        f"\n`esopt serve` throughput | model {args.model} ({dtype}, {model_dtype(args.model, args.dtype)} asked) | "
        f"device {args.device} | CPU {cpu_model()} ({os.cpu_count()} logical cores, torch threads "
        f"{torch.get_num_threads()}) | {args.requests} requests per level, max_tokens {args.max_tokens}, "
        f"greedy, {'JSON' if args.no_stream else 'streamed'} | max_batch {args.max_batch}, wait {args.wait_ms:g} ms\n"
    )
    print("| clients | requests | seconds | requests/s | completion tokens/s | first token p50 s | first token p95 s "
          "| total p50 s | total p95 s | first / total (p50) | rows/call |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['clients']} | {r['requests']} | {r['seconds']:.2f} | {r['requests'] / r['seconds']:.2f} | "
              f"{r['tokens'] / r['seconds']:.1f} | {r['first_p50']:.3f} | {r['first_p95']:.3f} | {r['p50']:.3f} | "
              f"{r['p95']:.3f} | {r['first_p50'] / r['p50']:.2f} | {r['rows_per_call']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
