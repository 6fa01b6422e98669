"""Which parameters ES perturbs: all of them, linear-layer weights only, or names matching a regex.

Tied weights (e.g. embedding and LM head) are one tensor and are counted once, under the first name
`named_parameters()` gives them: perturbing them twice would double their noise.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ParamScope:
    kind: Literal["full", "linear", "regex"] = "full"
    pattern: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("full", "linear", "regex"):
            raise ValueError(f"unknown scope {self.kind!r}; choose full, linear or regex")
        if self.kind == "regex":
            if not self.pattern:
                raise ValueError("scope 'regex' needs a pattern, e.g. 'layers\\.[0-3]\\.'")
            try:
                re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"scope pattern {self.pattern!r} is not a valid regex: {e}") from None

    def to_dict(self) -> dict:
        return asdict(self)


def select_parameters(model: torch.nn.Module, scope: ParamScope) -> list[tuple[str, torch.nn.Parameter]]:
    import torch

    named = list(model.named_parameters())  # deduplicated: tied tensors appear once
    if scope.kind == "full":
        chosen = named
    elif scope.kind == "linear":
        linear_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
        chosen = [(n, p) for n, p in named if id(p) in linear_ids]
    else:
        rx = re.compile(scope.pattern or "")
        chosen = [(n, p) for n, p in named if rx.search(n)]
    if not chosen:
        raise ValueError(f"scope {scope.to_dict()} selects no parameters of {type(model).__name__}")
    return chosen
