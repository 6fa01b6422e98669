"""The model behind the endpoint and the request checks both completion routes share: the names it answers
to, the body parsed and validated, prompts counted against its context length."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from esopt.serve.batcher import Batcher, Choice
from esopt.serve.prompt import ServedPrompt
from esopt.serve.protocol import APIError, RequestBody, generation_failed, validation_error

if TYPE_CHECKING:
    from fastapi import Request

MAX_BODY_BYTES = 32 * 2**20
DEFAULT_ALIAS = "default"  # what `HTTPReflector` sends

Body = TypeVar("Body", bound=RequestBody)


def context_length(policy) -> int | None:
    """The longest prompt + completion the model takes: its position table, or the tokenizer's limit."""
    limits = []
    config = getattr(getattr(policy, "model", None), "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(config, name, None)
        if isinstance(v, int) and v > 0:
            limits.append(v)
            break
    v = getattr(policy.tokenizer, "model_max_length", None)
    if isinstance(v, int) and 0 < v < 10**8:
        limits.append(v)
    return min(limits) if limits else None


class ServedModel:
    """One policy served under `name` (and `aliases`, and `default`), its batcher and prompt program.
    `context` is its context length in tokens (None: unknown, nothing is refused for length)."""

    def __init__(self, policy, batcher: Batcher, name: str, program: ServedPrompt | None,
                 aliases: Sequence[str], context: int | None):
        self.policy, self.batcher, self.name, self.program = policy, batcher, name, program
        self.names = {name, DEFAULT_ALIAS, *aliases}
        self.context = context

    def card(self) -> dict:
        return {"id": self.name, "object": "model", "created": 0, "owned_by": "esopt"}

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise APIError(404, f"The model `{name}` does not exist: this server serves `{self.name}`.",
                           "model", "model_not_found")

    async def parse(self, request: Request, kind: type[Body]) -> Body:
        """The request's JSON body validated as `kind`, for this model; any failure is an APIError."""
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise APIError(400, f"the body is not valid JSON: {str(e)[:200]}") from None
        if not isinstance(data, dict):
            raise APIError(400, f"the body must be a JSON object, got {type(data).__name__}")
        try:
            req = kind.model_validate(data)
        except ValidationError as e:
            raise validation_error(e.errors(include_url=False, include_context=False)) from None
        except RecursionError:
            raise APIError(400, "the body is nested too deeply") from None
        self.check_model(req.model)
        return req

    def count_tokens(self, prompt: str, param: str) -> int:
        try:
            n = len(self.batcher.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        except Exception as e:  # e.g. lone surrogates the tokenizer cannot encode
            raise APIError(400, f"{param}: the text cannot be tokenized ({type(e).__name__})",
                           param) from None
        if n == 0:
            raise APIError(400, f"{param}: the prompt is empty (0 tokens)", param)
        return n

    def max_tokens(self, prompt_tokens: int, asked: int | None, default: int, param: str) -> int:
        """max_tokens: the asked one if it fits the context, else a 400; unasked: the default, clipped."""
        ctx = self.context
        if ctx is None:
            return asked or default
        if (asked is not None and prompt_tokens + asked > ctx) or prompt_tokens >= ctx:
            raise APIError(
                400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                f"{prompt_tokens + (asked or 0)} tokens ({prompt_tokens} in the {param}, {asked or 0} in the "
                f"completion). Please reduce the length of the {param} or completion.", param,
                "context_length_exceeded")
        return asked if asked is not None else min(default, ctx - prompt_tokens)


async def await_choices(future: asyncio.Future) -> list[Choice]:
    """The batcher's answer; its failure (logged by the batcher) as a 500."""
    try:
        return await future
    except Exception as e:
        raise generation_failed(e, detail=True) from None
