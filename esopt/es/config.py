"""`ESConfig`: the validated ES settings. Light to import (no torch), so configs are checked at once."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from esopt.es.kinds import DEFAULT_CHUNK_NUMEL, noise_kinds, perturbation_class
from esopt.es.optim import OptimizerKind, optimizer_spec
from esopt.es.schedules import Schedule, ScheduleKind
from esopt.es.scope import ParamScope


class ESConfig(BaseModel):
    """The validated ES settings; the training config's `es:` section extends this class, so what a
    YAML file sets is exactly what `ES` runs with."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    population_size: int = Field(32, ge=1, description="G: members per generation")
    antithetic: bool = Field(False, description="members 2k, 2k+1 share a seed with signs +1, -1")
    sigma: float = Field(1e-3, gt=0, description="noise scale at generation 0")
    sigma_min: float = Field(2.5e-4, ge=0, description="sigma's floor at the end of the schedule; 0 over-fits (paper)")
    sigma_schedule: ScheduleKind = "cosine"
    alpha: float = Field(5e-4, ge=0, description="learning rate; the update is alpha/G * sum_i w_i eps_i")
    alpha_min: float = Field(0.0, ge=0)
    alpha_schedule: ScheduleKind = "constant"
    total_generations: int = Field(100, ge=1, description="schedule length")
    shaping: Literal["zscore", "centered_rank", "identity"] = "zscore"
    optimizer: OptimizerKind = Field(
        "sgd", description="sgd: theta += alpha/G sum w_i eps_i (the paper); adam: Adam with learning rate alpha on "
        "g = 1/G sum w_i eps_i (OpenAI-ES), its moments rebuilt from the ledger on replay (+8 bytes per parameter)")
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    adam_eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0, description="decoupled: theta *= 1 - alpha * weight_decay")
    scope: Literal["full", "linear", "regex"] = Field(
        "full", description="linear: linear-layer weights; regex: scope_pattern"
    )
    scope_pattern: str | None = None
    noise: str = Field("normal", description="noise kind: 'normal' (dense Gaussian), 'lowrank' (A B^T per matrix, "
                       "EGGROLL), 'subspace' (A0 B^T with A0 fixed for the run: a LoRA-shaped subspace) or any "
                       "registered Perturbation")
    noise_rank: int = Field(1, ge=1, description="lowrank, subspace: rank r of each member's A B^T")
    noise_others: Literal["frozen", "full"] = Field(
        "frozen", description="lowrank, subspace: non-matrix parameters (norms, biases) frozen or dense Gaussian"
    )
    restore: Literal["auto", "none", "exact", "subtract"] = Field(
        "auto", description="exact: fp32 master copy; subtract: no copy, drifts; none: no master, exact fp32 "
        "updates (bf16 keeps int16 low bits), an in-place member restored from a copy held while it is applied; "
        "auto: exact, or none for a batched population (whose members never touch the weights)")
    master_device: str = "cpu"
    chunk_numel: int = Field(DEFAULT_CHUNK_NUMEL, ge=1, description="noise chunk size, part of the noise spec")
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> ESConfig:
        if self.antithetic and self.population_size % 2:
            raise ValueError(f"antithetic sampling needs an even population_size (got {self.population_size})")
        if self.sigma_min > self.sigma and self.sigma_schedule != "constant":
            raise ValueError(f"sigma_min ({self.sigma_min}) must not exceed sigma ({self.sigma})")
        ParamScope(self.scope, self.scope_pattern)
        kinds = noise_kinds()
        if self.noise not in kinds:
            raise ValueError(f"unknown noise kind {self.noise!r}; registered: {kinds}")
        return self

    @property
    def param_scope(self) -> ParamScope:
        return ParamScope(self.scope, self.scope_pattern)

    def noise_spec(self) -> dict:
        kind: Any = perturbation_class(self.noise)  # a Perturbation class (esopt.es.perturbation, torch)
        return kind.make_spec(self.chunk_numel, rank=self.noise_rank, others=self.noise_others)

    def optimizer_spec(self) -> dict | None:
        return optimizer_spec(self.optimizer, self.adam_beta1, self.adam_beta2, self.adam_eps)

    def sigma_at(self, generation: int) -> float:
        return Schedule(self.sigma_schedule, self.sigma, self.sigma_min, self._length())(generation)

    def alpha_at(self, generation: int) -> float:
        return Schedule(self.alpha_schedule, self.alpha, self.alpha_min, self._length())(generation)

    def _length(self) -> int:
        if self.total_generations is None:
            raise ValueError("total_generations is not set: the schedules need their length")
        return self.total_generations
