"""Where a run's wall-clock goes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Timers:
    """Wall-clock split of ES work: perturb/restore/update (ES overhead) vs rollouts."""

    perturb: float = 0.0
    restore: float = 0.0
    rollout: float = 0.0
    update: float = 0.0
    eval: float = 0.0

    @property
    def es_overhead_share(self) -> float:
        """Share of (perturb + restore + update) in (those + rollouts); the ES overhead goal is <= 10%."""
        es = self.perturb + self.restore + self.update
        return es / max(es + self.rollout, 1e-9)
