"""`SearchConfig`: one heuristic-search run (problem, level, scaffold, arm, budget, decoding, ES settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from esopt.es import ESConfig

ARMS = ("frozen", "noise", "es")
MUTATIONS = ("m1", "m2")


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    problem: str = Field("binpacking-weibull", description="a name in esopt.envs.heuristics.PROBLEMS")
    sizes: dict[str, int | list[int]] = Field(default_factory=dict, description="instance size/count overrides")
    level: Literal["L0", "L1", "L2"] = "L0"
    scaffold: Literal["eoh", "sampling"] = Field(
        "eoh", description="eoh: i1 then e1 e2 m1 m2 batches over a population; sampling: every batch mutates "
                           "the best seed heuristic (independent samples)")
    arm: Literal["frozen", "noise", "es"] = Field(
        "frozen", description="frozen: the base model writes everything; noise: mutation batches are written by "
                              "perturbed members, never updated; es: perturbed members and an ES update per batch")
    budget: int = Field(48, ge=1, description="proposals, invalid ones included")
    population_size: int = Field(4, ge=1, description="EoH population N")
    batch_size: int = Field(4, ge=2, description="proposals per operator batch = ES members per mutation batch")
    seed: int = 0
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(50, ge=0)
    max_new_tokens: int = Field(24, ge=1)
    sigma: float = Field(1e-3, gt=0, description="cosine from sigma to sigma_min over the mutation batches")
    sigma_min: float = Field(0.0, ge=0)
    alpha: float = Field(5e-4, ge=0, description="ES learning rate (the noise arm records alpha 0)")
    noise: str = Field("lowrank", description="'lowrank' (all members in one batched generate) or 'normal'")
    noise_rank: int = Field(1, ge=1)
    sandbox: str = "bwrap"

    @model_validator(mode="after")
    def _check(self) -> SearchConfig:
        if self.budget % self.batch_size:
            raise ValueError(f"budget ({self.budget}) must be a multiple of batch_size ({self.batch_size})")
        if self.sigma_min > self.sigma:
            raise ValueError(f"sigma_min ({self.sigma_min}) must not exceed sigma ({self.sigma})")
        return self

    def plan(self) -> list[str]:
        """The operator of every batch, in order."""
        n = self.budget // self.batch_size
        if self.scaffold == "sampling":
            return ["m1"] * n
        cycle = ["e1", "e2", "m1", "m2"]
        return (["i1"] + [cycle[i % 4] for i in range(n - 1)])[:n]

    def perturbed(self, operator: str) -> bool:
        """Whether perturbed members write this batch (the paper: mutations only)."""
        return self.arm != "frozen" and operator in MUTATIONS

    def es_config(self) -> ESConfig:
        generations = max(1, sum(self.perturbed(op) for op in self.plan()))
        return ESConfig(population_size=self.batch_size, sigma=self.sigma, sigma_min=self.sigma_min,
                        sigma_schedule="cosine", alpha=self.alpha if self.arm == "es" else 0.0,
                        total_generations=generations, shaping="zscore", noise=self.noise,
                        noise_rank=self.noise_rank, noise_others="frozen", seed=self.seed)
