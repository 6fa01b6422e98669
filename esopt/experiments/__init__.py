"""The benchmarks and analyses behind results/: one file each with a `main(argv) -> int`, found by name here
(`esopt bench NAME ...`, `esopt analyze NAME ...`)."""

from __future__ import annotations

import importlib

BENCHMARKS: dict[str, str] = {
    "overhead": "esopt.experiments.es_overhead",
    "rollout": "esopt.experiments.rollout_throughput",
    "horizon": "esopt.experiments.horizon",  # a learning experiment: ES vs GRPO vs PPO as H* grows
    "population": "esopt.experiments.population",
    "efficiency": "esopt.experiments.efficiency",  # an ES generation vs pure inference of the same tokens
    "gpu": "esopt.experiments.gpu",
    "sandbox": "esopt.experiments.sandbox_overhead",  # per-call cost of each sandbox backend
    "serve": "esopt.experiments.serve_throughput",  # esopt serve at 1, 8 and 64 concurrent clients
    "heuristics": "esopt.experiments.heuristics",  # EoH + ES vs frozen / best-T / noise-only arms
    "es-variants": "esopt.experiments.es_variants",  # which ES settings raise validation success per episode
}
ANALYSES: dict[str, str] = {
    "variance": "esopt.experiments.variance",
    "step": "esopt.experiments.step_probe",
    "calibrate": "esopt.experiments.calibrate",
    "neighbourhood": "esopt.experiments.neighbourhood",
    "gain": "esopt.experiments.gain",
    "sensitivity": "esopt.experiments.sensitivity",  # antithetic pairs that score differently, per sigma
    "es-signal": "esopt.experiments.es_signal",  # noise-to-signal of each ES variant's update vs its dimension D
}


def run(kind: str, name: str, argv: list[str]) -> int:
    """Run benchmark or analysis `name` (kind: "bench" | "analyze") with its own arguments."""
    table = BENCHMARKS if kind == "bench" else ANALYSES
    if name not in table:
        what = "benchmark" if kind == "bench" else "analysis"
        raise ValueError(f"unknown {what} {name!r}; choose one of {sorted(table)}")
    return importlib.import_module(table[name]).main(argv) or 0
