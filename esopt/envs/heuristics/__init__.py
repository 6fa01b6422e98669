"""Heuristic-design problems: a constructive loop with one decision written by a model, instances by seed,
baselines and a bound or reference, and the evaluator that runs model-written code in the sandbox.

    problem = get_problem("binpacking-weibull")
    ev = HeuristicEvaluator(problem, {"train": problem.instances("train")})
    ev.score(problem.baselines["best fit"], "train").objective      # % over the L1 bound

Problems (name: interface, objective):
- `binpacking-weibull`, `binpacking-or`: FunSearch's `priority(item, bins)`, excess over ceil(sum/C) in %;
- `tsp`: EoH's `select_next_node(current, destination, unvisited, distances)`, gap to a 2-opt/or-opt
  reference in %.
`get_problem(name, **sizes)` overrides instance sizes and counts (the tests use small ones).
"""

from __future__ import annotations

from collections.abc import Callable

from esopt.envs.heuristics import binpacking, tsp
from esopt.envs.heuristics.evaluate import HeuristicEvaluator, Score, code_hash, score_host_baselines
from esopt.envs.heuristics.problem import Expression, Problem, Template
from esopt.envs.heuristics.safety import UnsafeCode, check_expression, check_heuristic

PROBLEMS: dict[str, Callable[..., Problem]] = {
    "binpacking-weibull": binpacking.weibull,
    "binpacking-or": binpacking.or_like,
    "tsp": tsp.uniform,
}


def get_problem(name: str, **sizes) -> Problem:
    """The problem called `name` (ValueError naming the choices if unknown)."""
    if name not in PROBLEMS:
        raise ValueError(f"unknown heuristic problem {name!r}; choose one of {sorted(PROBLEMS)}")
    return PROBLEMS[name](**sizes)


__all__ = ["PROBLEMS", "Expression", "HeuristicEvaluator", "Problem", "Score", "Template", "UnsafeCode",
           "check_expression", "check_heuristic", "code_hash", "get_problem", "score_host_baselines"]
