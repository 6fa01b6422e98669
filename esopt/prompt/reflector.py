"""Reflectors: the model that reads trajectories and writes lessons and skills.

`PolicyReflector` asks the policy itself (unperturbed, greedy). `HTTPReflector` asks any OpenAI-compatible
chat endpoint (`esopt serve`, vLLM, a hosted API): the key is read from an environment variable, each call
has a timeout and a few retries, and a failed, slow or malformed reply returns None with a log line, so the
caller keeps its current prompt and the run goes on.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
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
    def __init__(self, base_url: str, model: str = "default", api_key_env: str | None = None, timeout_s: float = 60.0,
                 retries: int = 2, max_tokens: int = 512, temperature: float = 0.0,
                 log: Callable[[str], None] = print, backoff_s: float = 0.5):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.retries, self.log, self.backoff_s = model, timeout_s, retries, log, backoff_s
        self.max_tokens, self.temperature = max_tokens, temperature
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not self.api_key:
            raise ValueError(f"reflector: environment variable {api_key_env} (the API key) is not set")

    def complete(self, messages: list[Message]) -> str | None:
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                           "temperature": self.temperature}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in range(1, self.retries + 2):
            why = None
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    reply = json.loads(resp.read().decode("utf-8", errors="replace"))
                text = reply["choices"][0]["message"]["content"]
                if isinstance(text, str):
                    return text
                why = f"content is {type(text).__name__}, not text"
            except urllib.error.HTTPError as e:
                why = f"HTTP {e.code}"
            except (urllib.error.URLError, TimeoutError, OSError) as e:
                why = f"no reply ({getattr(e, 'reason', e)})"
            except (ValueError, KeyError, IndexError, TypeError) as e:
                why = f"malformed reply ({type(e).__name__}: {str(e)[:80]})"
            self.log(f"reflector {self.url}: attempt {attempt}/{self.retries + 1} failed: {why}")
            if attempt <= self.retries:
                time.sleep(self.backoff_s * attempt)
        self.log(f"reflector {self.url}: giving up; the current prompt stays")
        return None
