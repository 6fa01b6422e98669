"""ES core: noise, perturbation, shaping, schedules, update and the seed ledger."""

from esopt.es.ledger import Ledger, read_history, replay
from esopt.es.noise import NOISE_SPEC_VERSION, NoiseSource, stream_seed
from esopt.es.schedules import Schedule
from esopt.es.scope import ParamScope, select_parameters
from esopt.es.shaping import SHAPERS, ZeroVariancePopulation, centered_rank, get_shaper, identity, zscore
from esopt.es.strategy import (
    ES,
    ESConfig,
    Member,
    ParameterNoise,
    TellResult,
    measure_restore_drift,
    member_seeds,
)

__all__ = [
    "ES", "ESConfig", "Ledger", "Member", "NOISE_SPEC_VERSION", "NoiseSource", "ParamScope", "ParameterNoise",
    "SHAPERS", "Schedule", "TellResult", "ZeroVariancePopulation", "centered_rank", "get_shaper", "identity",
    "measure_restore_drift", "member_seeds", "read_history", "replay", "select_parameters", "stream_seed", "zscore",
]
