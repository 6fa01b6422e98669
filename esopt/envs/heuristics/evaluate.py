"""Score model-written heuristics: allowlist check, one sandbox call per (heuristic, instance set), host-side
verification of every solution, a cache by code hash.

    ev = HeuristicEvaluator(problem, {"train": problem.instances("train")})
    ev.score(code, "train")       # Score(objective=3.91, ...) or Score(objective=None, error="...")

An invalid heuristic (refused by the allowlist, an exception, a wrong or non-finite output, an infeasible
solution, the time or memory limit) scores `objective=None`, never a number: under minimisation a 0.0 for
a failure would read as optimal.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass

from esopt.envs.heuristics.problem import RESULT_MARK, Problem
from esopt.envs.heuristics.safety import UnsafeCode, check_heuristic
from esopt.sandbox import check_backend, run_python


@dataclass(frozen=True)
class Score:
    objective: float | None  # mean objective over the instance set (lower is better); None: invalid
    per_instance: tuple[float, ...] = ()
    error: str = ""
    seconds: float = 0.0
    cached: bool = False

    @property
    def valid(self) -> bool:
        return self.objective is not None


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()[:16]


class HeuristicEvaluator:
    """Scores heuristics of one problem on named instance sets (e.g. train, val, test@50)."""

    def __init__(self, problem: Problem, instance_sets: dict[str, list[dict]], backend: str = "bwrap",
                 timeout: float | None = None, memory_mb: int = 1024):
        if not instance_sets or any(not v for v in instance_sets.values()):
            raise ValueError("every instance set needs at least one instance")
        check_backend(backend)  # fail now, not at the first proposal
        self.problem, self.sets, self.backend = problem, dict(instance_sets), backend
        self.timeout = problem.timeout if timeout is None else float(timeout)
        self.memory_mb = memory_mb
        self.cache: dict[tuple[str, str], Score] = {}
        self.sandbox_calls = 0
        self.sandbox_seconds = 0.0
        self._lock = threading.Lock()

    def score(self, code: str, split: str) -> Score:
        if split not in self.sets:
            raise ValueError(f"unknown instance set {split!r}; this evaluator has {sorted(self.sets)}")
        key = (code_hash(code), split)
        with self._lock:
            hit = self.cache.get(key)
        if hit is not None:
            return Score(hit.objective, hit.per_instance, hit.error, 0.0, cached=True)
        result = self._score(code, split)
        with self._lock:
            self.cache[key] = result
        return result

    def remember(self, code: str, split: str, objective: float | None, error: str = "") -> None:
        """Put a known result in the cache (a resumed run reads its earlier scores back)."""
        self.cache[(code_hash(code), split)] = Score(objective, (), error)

    def _score(self, code: str, split: str) -> Score:
        p = self.problem
        try:
            check_heuristic(code, p.function, p.arguments)
        except UnsafeCode as e:
            return Score(None, error=f"refused: {e}")
        instances = self.sets[split]
        start = time.perf_counter()
        r = run_python(p.sandbox_script(code, instances), backend=self.backend, timeout=self.timeout,
                       cpu_seconds=max(1, int(self.timeout)), memory_mb=self.memory_mb,
                       max_output_bytes=16_000_000, max_processes=4, disk_mb=4)
        seconds = time.perf_counter() - start
        self.sandbox_calls += 1
        self.sandbox_seconds += seconds
        if r.timed_out or r.signal_name in ("SIGXCPU", "SIGKILL"):
            return Score(None, error=f"time limit ({self.timeout:g} s for {len(instances)} instances)",
                         seconds=seconds)
        line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith(RESULT_MARK)), None)
        if line is None:
            tail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
            return Score(None, error=f"no result ({tail[:200]})", seconds=seconds)
        try:
            result = json.loads(line[len(RESULT_MARK):])
        except json.JSONDecodeError:
            return Score(None, error="unreadable result", seconds=seconds)
        if not result.get("ok"):
            return Score(None, error=str(result.get("error", "error"))[:300], seconds=seconds)
        solutions = result.get("solutions")
        if not isinstance(solutions, list) or len(solutions) != len(instances):
            return Score(None, error="wrong number of solutions", seconds=seconds)
        try:
            values = tuple(p.check(inst, sol) for inst, sol in zip(instances, solutions))
        except ValueError as e:
            return Score(None, error=f"infeasible: {e}", seconds=seconds)
        return Score(sum(values) / len(values), values, seconds=seconds)


def score_host_baselines(problem: Problem, instances: list[dict]) -> dict[str, float]:
    """Mean objective of each trusted host baseline (first fit, best fit, nearest neighbour, ...)."""
    out = {}
    for name, solve in problem.host_baselines().items():
        out[name] = sum(problem.check(inst, solve(inst)) for inst in instances) / len(instances)
    return out
