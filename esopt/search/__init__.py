"""Test-time heuristic design: an EoH-style program search whose proposals a language model writes, with the
model frozen, perturbed without updates, or tuned online by ES (the project's ES core, ledger and replay).

    from esopt.search import HeuristicSearch, SearchConfig
    config = SearchConfig(problem="binpacking-weibull", level="L0", arm="es", budget=48, seed=0)
    summary = HeuristicSearch(config, engine, "runs/heur/es-0").run()

`esopt bench heuristics` runs the matched arms over seeds and writes the table (esopt.experiments.heuristics).
"""

from __future__ import annotations

from esopt.search.config import ARMS, SearchConfig
from esopt.search.driver import HeuristicSearch, baseline_scores, instance_sets, read_batches
from esopt.search.population import Individual, manage, rank_probabilities, select
from esopt.search.scripted import ScriptedEngine

__all__ = ["ARMS", "HeuristicSearch", "Individual", "ScriptedEngine", "SearchConfig", "baseline_scores",
           "instance_sets", "manage", "rank_probabilities", "read_batches", "select"]
