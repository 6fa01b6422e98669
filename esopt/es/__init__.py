"""ES core: noise, the perturbation seam, shaping, schedules, ask/tell and the seed ledger.

Names are imported on first use (PEP 562), so `from esopt.es import ESConfig` does not load torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "esopt.es.config": ["ESConfig"],
    "esopt.es.ledger": ["Ledger", "read_history", "replay"],
    "esopt.es.noise": ["NoiseSource", "stream_seed"],
    "esopt.es.optim": ["AdamState"],
    "esopt.es.perturbation": ["PERTURBATIONS", "GaussianNoise", "Perturbation", "apply_record", "build_perturbation",
                              "register_perturbation", "update_coefficients"],
    "esopt.es.schedules": ["Schedule"],
    "esopt.es.scope": ["ParamScope", "select_parameters"],
    "esopt.es.shaping": ["SHAPERS", "ZeroVariancePopulation", "centered_rank", "get_shaper", "identity", "zscore"],
    "esopt.es.strategy": ["ES", "Member", "TellResult", "measure_restore_drift", "population_members"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'esopt.es' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return __all__
