"""`esopt serve MODEL`: an OpenAI-compatible chat endpoint for a model or a run's checkpoint.

`GET /v1/models` and `POST /v1/chat/completions` (messages, temperature, top_p, max_tokens, stop, seed), on
FastAPI + uvicorn, bound to 127.0.0.1 unless told otherwise. Requests that arrive together are answered
by one batched `generate` call (grouped by sampling settings): the batch grows with load, which is what a
CPU's AMX units and a GPU need. If MODEL has a `prompt.json` ({"system": ...}), its system prompt is used
for conversations that bring none. Any OpenAI client can talk to a fine-tuned agent this way, and the
co-evolution reflector can use it.

    esopt serve runs/demo/final --port 8000
    curl -s localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "hi"}]}'
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from esopt.policies.base import SamplingParams


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    """The part of OpenAI's chat request this server honours (other fields are ignored)."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1, le=8192)
    stop: str | list[str] | None = None
    seed: int | None = None


@dataclass
class _Request:
    prompt: str
    sampling: SamplingParams
    seed: int | None
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Collects requests for up to `wait_s` (or `max_batch` of them) and answers them in batched calls."""

    def __init__(self, policy, max_batch: int = 32, wait_s: float = 0.005):
        self.policy, self.max_batch, self.wait_s = policy, max_batch, wait_s
        self.queue: asyncio.Queue[_Request] = asyncio.Queue()
        self.batches = 0  # generate calls made (tests check that concurrent requests share one)

    async def submit(self, prompt: str, sampling: SamplingParams, seed: int | None):
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Request(prompt, sampling, seed, future))
        return await future

    async def run(self) -> None:
        while True:
            pending = [await self.queue.get()]
            deadline = time.monotonic() + self.wait_s
            while len(pending) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                try:
                    pending.append(await asyncio.wait_for(self.queue.get(), left))
                except asyncio.TimeoutError:
                    break
            groups: dict = {}
            for r in pending:
                groups.setdefault((r.sampling, r.seed), []).append(r)
            for (sampling, seed), group in groups.items():
                try:
                    out = await asyncio.to_thread(self.policy.generate, [r.prompt for r in group], sampling, seed)
                    self.batches += 1
                    for r, completion in zip(group, out):
                        r.future.set_result(completion)
                except Exception as e:  # one bad batch answers its requests with the error, the server lives on
                    for r in group:
                        if not r.future.done():
                            r.future.set_exception(e)


def load_system_prompt(model_dir: str | Path) -> str | None:
    path = Path(model_dir) / "prompt.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("system")


def build_app(policy, model_name: str, system_prompt: str | None = None, max_batch: int = 32,
              wait_s: float = 0.005):
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, HTTPException

    batcher = Batcher(policy, max_batch, wait_s)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()

    app = FastAPI(title="esopt serve", lifespan=lifespan)
    app.state.batcher = batcher

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "esopt"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        messages = [m.model_dump() for m in req.messages]
        if system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system_prompt})
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        try:
            sampling = SamplingParams(req.temperature, req.top_p, 0, req.max_tokens, stop)
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from None
        completion = await batcher.submit(policy.build_prompt(messages), sampling, req.seed)
        finished = len(completion.token_ids) >= req.max_tokens and not stop
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": completion.text},
                         "finish_reason": "length" if finished else "stop"}],
            "usage": {"prompt_tokens": len(completion.prompt_ids), "completion_tokens": len(completion.token_ids),
                      "total_tokens": len(completion.prompt_ids) + len(completion.token_ids)},
        }

    return app


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, dtype: str = "auto", device: str = "cpu",
          max_batch: int = 32) -> None:
    import uvicorn

    from esopt.policies import load_policy

    policy = load_policy(model, dtype=dtype, device=device)
    app = build_app(policy, Path(model).name or model, load_system_prompt(model) if Path(model).is_dir() else None,
                    max_batch=max_batch)
    uvicorn.run(app, host=host, port=port, log_level="warning")
