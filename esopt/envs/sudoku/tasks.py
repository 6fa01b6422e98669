"""Sudoku tasks: the validated `SudokuTask`, JSON(L) input and output, and seeded generation."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np

from esopt.envs.sudoku.grid import (
    BOX_SHAPES,
    _as_grid,
    _check_h_star,
    _check_size,
    _find_clash_any,
    _infer_size,
    count_solutions,
    is_valid_solution,
)

UNIQUE_TRIES = 20  # generation attempts at a uniquely solvable puzzle


@dataclass
class SudokuTask:
    """One puzzle. `puzzle` uses 0 for empty cells; `h_star` is its number of empty cells."""

    puzzle: list[list[int]]
    solution: list[list[int]] | None
    size: int
    h_star: int

    def __post_init__(self) -> None:
        self.size = _check_size(self.size)
        self.puzzle = _as_grid(self.puzzle, self.size, "puzzle", allow_empty=True)
        holes = sum(v == 0 for row in self.puzzle for v in row)
        if self.h_star != holes:
            raise ValueError(f"h_star must equal the number of empty cells ({holes}), got {self.h_star!r}")
        self.h_star = holes
        if self.solution is not None:
            self.solution = _as_grid(self.solution, self.size, "solution", allow_empty=False)
            if not is_valid_solution(self.solution, self.puzzle):
                raise ValueError("solution is not a valid completion of puzzle")
        elif (clash := _find_clash_any(self.puzzle)) is not None:
            raise ValueError(f"puzzle givens conflict at r{clash[0] + 1}c{clash[1] + 1}")

    def to_json(self) -> str:
        """One-line JSON: {"size", "h_star", "puzzle", "solution"}."""
        data = {"size": self.size, "h_star": self.h_star, "puzzle": self.puzzle, "solution": self.solution}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any], size: int | None = None) -> SudokuTask:
        """Parse a JSON line or dict. `puzzle` (and optional `solution`) may be a list of rows, a flat list,
        or a string of digits with 0 or '.' for empty; `size` and `h_star` are inferred when missing."""
        obj = json.loads(data) if isinstance(data, str) else data
        if not isinstance(obj, Mapping) or "puzzle" not in obj:
            raise ValueError("a task must be a JSON object with a 'puzzle' field")
        if size is None:
            size = obj.get("size")
        if size is None:
            size = _infer_size(obj["puzzle"])
        size = _check_size(size)
        if obj.get("size") is not None and obj["size"] != size:
            raise ValueError(f"task size {obj['size']!r} does not match the expected size {size}")
        puzzle = _as_grid(obj["puzzle"], size, "puzzle", allow_empty=True)
        solution = obj.get("solution")
        if solution is not None:
            solution = _as_grid(solution, size, "solution", allow_empty=False)
        holes = sum(v == 0 for row in puzzle for v in row)
        return cls(puzzle=puzzle, solution=solution, size=size, h_star=obj.get("h_star", holes))


def _solution_grid(rng: np.random.Generator, size: int) -> list[list[int]]:
    """A base pattern shuffled by bands, rows in bands, stacks, columns in stacks and digit relabelling."""
    br, bc = BOX_SHAPES[size]
    base = [[(bc * (r % br) + r // br + c) % size + 1 for c in range(size)] for r in range(size)]
    # size // br bands of br rows; size // bc stacks of bc columns
    rows = [int(b) * br + int(i) for b in rng.permutation(size // br) for i in rng.permutation(br)]
    cols = [int(s) * bc + int(j) for s in rng.permutation(size // bc) for j in rng.permutation(bc)]
    digits = [0] + [int(d) + 1 for d in rng.permutation(size)]
    return [[digits[base[r][c]] for c in cols] for r in rows]


def generate_task(rng: np.random.Generator, size: int, h_star: int, unique: bool = False) -> SudokuTask:
    """A random puzzle with exactly `h_star` empty cells. unique=True: the solution is unique."""
    size = _check_size(size)
    h_star = _check_h_star(h_star, size)
    if not unique:
        solution = _solution_grid(rng, size)
        puzzle = [row[:] for row in solution]
        for k in rng.choice(size * size, size=h_star, replace=False):
            puzzle[int(k) // size][int(k) % size] = 0
        return SudokuTask(puzzle=puzzle, solution=solution, size=size, h_star=h_star)
    best = 0
    for _ in range(UNIQUE_TRIES):
        solution = _solution_grid(rng, size)
        puzzle = [row[:] for row in solution]
        holes = 0
        for k in rng.permutation(size * size):
            r, c = int(k) // size, int(k) % size
            puzzle[r][c] = 0
            if count_solutions(puzzle, size, limit=2) == 1:
                holes += 1
                if holes == h_star:
                    return SudokuTask(puzzle=puzzle, solution=solution, size=size, h_star=h_star)
            else:
                puzzle[r][c] = solution[r][c]
        best = max(best, holes)
    raise ValueError(
        f"could not build a uniquely solvable {size}x{size} puzzle with h_star={h_star} in {UNIQUE_TRIES} "
        f"tries (most holes reached: {best}); lower h_star or use unique=False"
    )


def make_task_set(seed: int, size: int, h_star: int, count: int, unique: bool = False) -> list[SudokuTask]:
    """`count` puzzles, reproducible from the arguments; task i does not depend on `count`."""
    if isinstance(count, bool) or not isinstance(count, Integral) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    size = _check_size(size)
    h_star = _check_h_star(h_star, size)
    entropy = [int(seed), size, h_star, int(bool(unique))]
    return [
        generate_task(
            np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(i,))), size, h_star, unique
        )
        for i in range(count)
    ]


def save_tasks_jsonl(path: str | Path, tasks: Iterable[SudokuTask]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(task.to_json() + "\n")


def load_tasks_jsonl(path: str | Path, size: int | None = None) -> list[SudokuTask]:
    """Tasks from a JSONL file (ours or external: `puzzle` required, `solution` optional).
    With `size`, every puzzle must have that size."""
    tasks = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                tasks.append(SudokuTask.from_json(line, size=size))
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                raise ValueError(f"{path}:{lineno}: {e}") from e
    return tasks
