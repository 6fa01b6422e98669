"""The OpenAI wire format the server speaks: the request bodies it validates (the part of OpenAI's schema it
honours; other fields are ignored), its errors in OpenAI's shape, and the envelope every response body and
server-sent event shares."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from esopt.engines.base import SamplingParams

MAX_N = 128  # choices per request (OpenAI's limit)
MAX_STOP = 16
MIN_TEMPERATURE = 1e-5  # below it: greedy (as vLLM does)
STREAM_END = "data: [DONE]\n\n"


# --- request bodies ----------------------------------------------------------------------------------

class RequestBody(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ContentPart(RequestBody):
    type: str
    text: str | None = None


class Message(RequestBody):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, v):
        if isinstance(v, list):
            for part in v:
                if part.type != "text" or part.text is None:
                    raise ValueError(f"only text content parts are supported, got type {part.type!r}")
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)


class StreamOptions(RequestBody):
    include_usage: bool = False


class CommonRequest(RequestBody):
    """The fields chat and legacy completion requests share: the model, sampling, `n`, `stop`, streaming."""

    model: str | None = None
    temperature: float = Field(0.7, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return v

    @property
    def stops(self) -> tuple[str, ...] | None:
        if self.stop is None:
            return None
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def generation_seed(self) -> int | None:
        """The seed as the engine takes it: OpenAI allows negative seeds, the engine wants 0..2**64-1."""
        return None if self.seed is None else self.seed % 2**64

    def sampling(self, max_tokens: int, stop: tuple[str, ...]) -> SamplingParams:
        # a temperature this close to 0 is greedy decoding (logits / 1e-300 overflow to inf, then NaN)
        temperature = self.temperature if self.temperature >= MIN_TEMPERATURE else 0.0
        try:
            return SamplingParams(temperature, self.top_p, 0, max_tokens, stop)
        except ValueError as e:
            raise APIError(400, str(e)) from None


class ChatRequest(CommonRequest):
    """The part of OpenAI's chat request this server honours (other fields are ignored)."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _no_top_logprobs(self):
        if self.top_logprobs:
            raise ValueError("top_logprobs > 0 is not supported "
                             "(the chosen tokens' logprobs are: logprobs=true)")
        return self


class CompletionRequest(CommonRequest):
    """OpenAI's legacy completions request: raw text in, no chat template, no prompt program."""

    prompt: str | list[str]
    max_tokens: int | None = Field(None, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _text_prompts(cls, data):
        if isinstance(data, dict):
            p = data.get("prompt")
            if isinstance(p, list) and p and all(isinstance(x, int) or isinstance(x, list) for x in p):
                raise ValueError("token-id prompts are not supported: send the prompt as text")
        return data

    @model_validator(mode="after")
    def _supported(self):
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt: the list of prompts is empty")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.logprobs:
            raise ValueError("logprobs > 0 (top alternatives) is not supported; "
                             "logprobs=0 gives the chosen tokens'")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        return self

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


# --- errors ------------------------------------------------------------------------------------------

class APIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(errors: Sequence[dict]) -> APIError:
    """pydantic's errors (at most 5 of them) as one 400, its `param` the first failing field's path."""
    parts, param = [], None
    for e in list(errors)[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        # drop pydantic's union-branch labels ("str", "list[str]") so the param is the field path
        loc = [x for x in loc if not any(c in x for c in "[]") and x not in ("str", "int", "function-after")]
        where = ".".join(loc)
        param = param or where or None
        msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return APIError(400, "; ".join(parts) or "invalid request", param)


def generation_failed(e: Exception, detail: bool) -> APIError:
    """A failed `generate` call as a 500; `detail` adds the exception's (clipped) message."""
    message = f"generation failed: {type(e).__name__}" + (f": {str(e)[:200]}" if detail else "")
    return APIError(500, message, type_="server_error")


# --- responses -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ResponseHead:
    """What every body of one response (and every chunk of its stream) carries: id, object, time, model."""

    id: str
    object: str
    created: int
    model: str

    @classmethod
    def new(cls, id_prefix: str, object: str, model: str) -> ResponseHead:
        return cls(f"{id_prefix}-{uuid.uuid4().hex[:24]}", object, int(time.time()), model)

    def body(self, choices: list[dict], object: str | None = None, **more: Any) -> dict:
        return {"id": self.id, "object": object or self.object, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **more}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(data: Any) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
