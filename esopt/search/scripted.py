"""A scripted stand-in for a language model: it returns fixed programs, for tests and `--model scripted` smoke
runs. It holds a small torch model so the noise and ES arms perturb, update and replay real weights.

mode "cycle": the outputs in call order (one per prompt), for exact expectations in tests.
mode "hashed": output = f(prompt, sampling seed, current weights), a pure function, so a resumed run writes
exactly what an uninterrupted one does and perturbed members write different programs.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence

import torch

from esopt.engines.base import Completion, SamplingParams


class ScriptedEngine:
    def __init__(self, outputs: Sequence[str], mode: str = "cycle", seed: int = 0):
        if not outputs:
            raise ValueError("a scripted engine needs at least one output")
        if mode not in ("cycle", "hashed"):
            raise ValueError(f"unknown mode {mode!r}; choose cycle or hashed")
        self.outputs, self.mode = list(outputs), mode
        gen = torch.Generator().manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        self.tokenizer = None
        self.prompts: list[str] = []  # every prompt seen, in order
        self.count = 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def build_prompt(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"

    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None,
                 return_logprobs: bool = False, members: Sequence[int] | None = None) -> list[Completion]:
        out = []
        for i, p in enumerate(prompts):
            self.prompts.append(p)
            if self.mode == "cycle":
                k = self.count % len(self.outputs)
            else:
                with torch.no_grad():
                    w = float(sum(x.double().sum() for x in self.model.parameters()))
                k = (zlib.crc32(p.encode()) + 7919 * (seed or 0) + i + int(abs(w) * 1e7)) % len(self.outputs)
            self.count += 1
            out.append(Completion([], [], self.outputs[k]))
        return out

    def weights_changed(self) -> None:
        pass

    @contextlib.contextmanager
    def rollout_scope(self, growing: bool = False) -> Iterator[None]:
        yield
