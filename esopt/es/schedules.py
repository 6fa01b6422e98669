"""Step-size schedules for sigma (noise scale) and alpha (learning rate).

The paper decays sigma with a cosine to a non-zero floor: no decay hurts, a floor of 0 over-fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ScheduleKind = Literal["constant", "cosine", "linear"]


@dataclass(frozen=True)
class Schedule:
    """value(step) for step in [0, total): from `start` at step 0 to `end` at step total-1."""

    kind: ScheduleKind
    start: float
    end: float
    total: int

    def __post_init__(self) -> None:
        if self.kind not in ("constant", "cosine", "linear"):
            raise ValueError(f"unknown schedule {self.kind!r}; choose constant, cosine or linear")
        if not (math.isfinite(self.start) and self.start >= 0):
            raise ValueError(f"schedule start must be a finite number >= 0, got {self.start}")
        if not (math.isfinite(self.end) and self.end >= 0):
            raise ValueError(f"schedule end must be a finite number >= 0, got {self.end}")
        if self.total < 1:
            raise ValueError(f"schedule total must be >= 1, got {self.total}")

    def __call__(self, step: int) -> float:
        if self.kind == "constant" or self.total == 1:
            return self.start
        t = min(max(step, 0), self.total - 1) / (self.total - 1)
        if self.kind == "linear":
            return self.start + (self.end - self.start) * t
        return self.end + 0.5 * (self.start - self.end) * (1.0 + math.cos(math.pi * t))
