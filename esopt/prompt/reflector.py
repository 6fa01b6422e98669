"""Reflectors: the model that reads trajectories and writes lessons and skills.

`PolicyReflector` asks the policy itself (unperturbed, greedy). `HTTPReflector` asks any OpenAI-compatible
chat endpoint (`esopt serve`, vLLM, a hosted API): the key is read from an environment variable, each call
has a timeout and a few retries, and a failed, slow or malformed reply returns None with a log line, so the
caller keeps its current prompt and the run goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

Message = dict[str, str]


class Reflector(Protocol):
    def complete(self, messages: list[Message]) -> str | None:
        """The reply text, or None when no usable reply came."""
        ...


class PolicyReflector:
    def __init__(self, policy, max_new_tokens: int = 256):
        from esopt.engines.base import SamplingParams

        self.policy, self.sampling = policy, SamplingParams(temperature=0, max_new_tokens=max_new_tokens)

    def complete(self, messages: list[Message]) -> str | None:
        return self.policy.generate([self.policy.build_prompt(messages)], self.sampling)[0].text


class HTTPReflector:
    """An OpenAI-compatible chat endpoint (`esopt serve`, vLLM, a hosted model) through the `openai` client,
    which retries connection errors, timeouts, 429 and 5xx with backoff. A reply that never comes or cannot
    be read is logged in one line and gives None: the current prompt then stays."""

    def __init__(self, base_url: str, model: str = "default", api_key_env: str | None = None, timeout_s: float = 60.0,
                 retries: int = 2, max_tokens: int = 512, temperature: float = 0.0,
                 log: Callable[[str], None] = print):
        import openai

        api_key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not api_key:
            raise ValueError(f"reflector: environment variable {api_key_env} (the API key) is not set")
        self.url, self.model, self.retries, self.log = base_url.rstrip("/"), model, retries, log
        self.max_tokens, self.temperature = max_tokens, temperature
        self.openai = openai
        self.client = openai.OpenAI(base_url=self.url, api_key=api_key or "unused", timeout=timeout_s,
                                    max_retries=retries)

    def complete(self, messages: list[Message]) -> str | None:
        o = self.openai
        try:
            reply = self.client.chat.completions.create(model=self.model, messages=messages,  # type: ignore[arg-type]
                                                        max_tokens=self.max_tokens, temperature=self.temperature)
            text = reply.choices[0].message.content
            if isinstance(text, str):
                return text
            why = f"content is {type(text).__name__}, not text"
        except o.APIStatusError as e:
            why = f"HTTP {e.status_code}"
        except (o.APITimeoutError, o.APIConnectionError) as e:
            why = f"no reply ({type(e).__name__})"
        except (o.APIError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            why = f"malformed reply ({type(e).__name__}: {str(e)[:80]})"
        self.log(f"reflector {self.url}: no usable reply ({why}; transient errors retried {self.retries}x); the "
                 "current prompt stays")
        return None
