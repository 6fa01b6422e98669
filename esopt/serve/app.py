"""The FastAPI app (routes wired to the handlers in `chat.py` / `completions.py`, errors in OpenAI's shape),
a uvicorn server on a thread (tests, benchmarks), and `serve()` behind `esopt serve`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esopt.serve.batcher import Batcher
from esopt.serve.chat import chat_completion
from esopt.serve.completions import text_completion
from esopt.serve.prompt import ServedPrompt, load_prompt_program
from esopt.serve.protocol import APIError, ChatRequest, CompletionRequest, validation_error
from esopt.serve.served import ServedModel, context_length

try:  # the serve extra; at module level so FastAPI can resolve the handlers' (string) annotations
    from fastapi import Request
except ImportError:  # the prompt-program helpers work without it
    Request = Any

log = logging.getLogger("esopt.serve")


def build_app(policy, model_name: str, system_prompt: str | None = None, max_batch: int = 32,
              wait_s: float = 0.005, program: ServedPrompt | None = None, aliases: Sequence[str] = (),
              max_context: int | None = None):
    """The FastAPI app. `program` (or just `system_prompt`) is put in front of chat conversations that bring
    no system message; `aliases` are further names the model answers to; `max_context` overrides the
    model's context length."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    if program is None and system_prompt:
        program = ServedPrompt(system=system_prompt)
    batcher = Batcher(policy, max_batch, wait_s)
    served = ServedModel(policy, batcher, model_name, program, aliases, max_context or context_length(policy))

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()

    app = FastAPI(title="esopt serve", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.program = program
    app.state.context_length = served.context
    _answer_errors_in_openai_shape(app)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [served.card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        served.check_model(model_id)
        return served.card()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await chat_completion(served, await served.parse(request, ChatRequest))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await text_completion(served, await served.parse(request, CompletionRequest))

    return app


def _answer_errors_in_openai_shape(app) -> None:
    """Every error, FastAPI's own (validation, unknown route) and a crash included, as OpenAI's error body."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return JSONResponse(validation_error(exc.errors()).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(APIError(exc.status_code, str(exc.detail), None, code).body(),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request, exc: Exception):
        log.exception("esopt serve: internal error")
        error = APIError(500, f"internal error: {type(exc).__name__}", type_="server_error")
        return JSONResponse(error.body(), status_code=500)


@dataclass
class RunningServer:
    """A uvicorn server on a thread of this process (tests, benchmarks)."""

    server: Any
    thread: Any
    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)


def start_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 60.0) -> RunningServer:
    """Run `app` under uvicorn on a daemon thread; port 0 lets the OS pick a free port (read back from the
    bound socket, so two servers never race for one)."""
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, name="esopt-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"esopt serve did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(server, thread, host, bound)


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, dtype: str = "auto", device: str = "cpu",
          max_batch: int = 32, served_model_name: str | None = None, prompt: bool = True,
          wait_ms: float = 5.0) -> None:
    """`esopt serve MODEL`: load the policy (and, unless `prompt` is off, its prompt program) and serve it
    until interrupted."""
    import uvicorn

    from esopt.models import load_policy

    policy = load_policy(model, dtype=dtype, device=device)
    program = load_prompt_program(model, warn=print) if prompt else None
    name = served_model_name or model
    aliases = {Path(model).name} if Path(model).name else set()
    app = build_app(policy, name, program=program, max_batch=max_batch, wait_s=wait_ms / 1000,
                    aliases=aliases)
    print(f"esopt serve: {name} on http://{host}:{port}/v1 | context {app.state.context_length} tokens | "
          f"prompt program: {program.describe() if program else 'none'}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
