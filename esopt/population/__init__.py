"""Population evaluators: where and how an ES generation's members run. One file per kind, one line each in
`EVALUATORS` (a class, or "module:Class" imported on first use; an import error is raised, never hidden)."""

from __future__ import annotations

from esopt.population.base import (
    Evaluator,
    MemberResult,
    PopulationContext,
    ReplicaParts,
    member_score,
    run_member,
)
from esopt.utils.registry import lookup

EVALUATORS: dict[str, type | str] = {
    "local": "esopt.population.local:LocalEvaluator",
    "batched": "esopt.population.batched:BatchedEvaluator",
    "ray": "esopt.population.ray:RayEvaluator",
}


def evaluator_class(kind: str) -> type:
    return lookup(EVALUATORS, kind, "population evaluator")


def build_evaluator(kind: str, context: PopulationContext) -> Evaluator:
    return evaluator_class(kind)(context)


__all__ = ["EVALUATORS", "Evaluator", "MemberResult", "PopulationContext", "ReplicaParts", "build_evaluator",
           "evaluator_class", "member_score", "run_member"]
