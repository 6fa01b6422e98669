"""The registry of noise kinds, light to import (no torch), so a config is checked without loading torch.

A kind is a `Perturbation` class named by its `dist`; built-in kinds are listed by "module:Class" and
imported on first use, and `perturbation.register_perturbation` adds (or replaces) a kind by its class.
"""

from __future__ import annotations

from esopt.utils.registry import lookup

DEFAULT_CHUNK_NUMEL = 1 << 20  # 4 MiB of fp32 per noise chunk

PERTURBATIONS: dict[str, type | str] = {
    "normal": "esopt.es.perturbation:GaussianNoise",
    "lowrank": "esopt.es.perturbation:LowRankNoise",
    "subspace": "esopt.es.perturbation:SubspaceNoise",
}


def noise_kinds() -> list[str]:
    return sorted(PERTURBATIONS)


def perturbation_class(dist: str) -> type:
    return lookup(PERTURBATIONS, dist, "noise kind")
