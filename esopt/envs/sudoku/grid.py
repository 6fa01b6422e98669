"""Sudoku's rules on plain grids (lists of rows, 0 = empty): sizes and boxes, validity, clashes, candidate
digits, a bitmask solver and the oracle's next move."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral
from typing import Any

import numpy as np

# size -> (box rows, box cols)
BOX_SHAPES: dict[int, tuple[int, int]] = {4: (2, 2), 6: (2, 3), 9: (3, 3)}
def _check_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, Integral) or int(size) not in BOX_SHAPES:
        raise ValueError(f"size must be one of {sorted(BOX_SHAPES)}, got {size!r}")
    return int(size)


def _check_h_star(h_star: Any, size: int) -> int:
    if isinstance(h_star, bool) or not isinstance(h_star, Integral) or not 1 <= h_star <= size * size:
        raise ValueError(f"h_star must be an integer in 1..{size * size} for size {size}, got {h_star!r}")
    return int(h_star)


def box_index(r: int, c: int, size: int) -> int:
    """0-based index of the box holding 0-based cell (r, c); boxes are numbered row-major."""
    br, bc = BOX_SHAPES[size]
    return (r // br) * (size // bc) + c // bc


def _infer_size(value: Any) -> int:
    if isinstance(value, str):
        n = len("".join(value.split()))
    elif isinstance(value, Sequence) and value and isinstance(value[0], Sequence):
        return len(value)
    elif isinstance(value, Sequence):
        n = len(value)
    else:
        raise ValueError(f"puzzle must be a list of rows or a string of digits, got {type(value).__name__}")
    side = math.isqrt(n)
    if side * side != n or side not in BOX_SHAPES:
        raise ValueError(f"puzzle has {n} cells; expected 16, 36 or 81")
    return side


def _as_grid(value: Any, size: int, name: str, allow_empty: bool) -> list[list[int]]:
    """Normalise a list of rows / flat list / digit string into a size x size list of int lists."""
    if isinstance(value, str):
        chars = "".join(value.split())
        if len(chars) != size * size or any(ch not in ".0123456789" for ch in chars):
            raise ValueError(f"{name} string must hold {size * size} characters from '.0123456789'")
        flat = [0 if ch == "." else int(ch) for ch in chars]
    elif (
        isinstance(value, (Sequence, np.ndarray))
        and len(value) == size
        and all(isinstance(row, (Sequence, np.ndarray)) and not isinstance(row, str) for row in value)
    ):
        if any(len(row) != size for row in value):
            raise ValueError(f"{name} must be {size}x{size}")
        flat = [v for row in value for v in row]
    elif isinstance(value, (Sequence, np.ndarray)) and len(value) == size * size:
        flat = list(value)
    else:
        raise ValueError(f"{name} must be a {size}x{size} grid, a flat list or a digit string")
    lo = 0 if allow_empty else 1
    for v in flat:
        if isinstance(v, bool) or not isinstance(v, Integral) or not lo <= v <= size:
            raise ValueError(f"{name} values must be integers in {lo}..{size}, got {v!r}")
    return [[int(v) for v in flat[r * size : (r + 1) * size]] for r in range(size)]


def is_valid_solution(grid: Any, puzzle: Any) -> bool:
    """True iff `grid` is a full valid Sudoku that keeps every given of `puzzle` (None: no givens)."""
    try:
        n = len(grid)
        if n not in BOX_SHAPES or any(len(row) != n for row in grid):
            return False
        want = list(range(1, n + 1))
        if any(sorted(row) != want for row in grid):  # also rejects non-integers / out-of-range values
            return False
        if any(sorted(grid[r][c] for r in range(n)) != want for c in range(n)):
            return False
        boxes: list[list[int]] = [[] for _ in range(n)]
        for r in range(n):
            for c in range(n):
                boxes[box_index(r, c, n)].append(grid[r][c])
        if any(sorted(b) != want for b in boxes):
            return False
        if puzzle is not None:
            if len(puzzle) != n:
                return False
            for r in range(n):
                for c in range(n):
                    if puzzle[r][c] and puzzle[r][c] != grid[r][c]:
                        return False
        return True
    except (TypeError, IndexError, ValueError, KeyError):
        return False


def find_clash(board: Sequence[Sequence[int]], r: int, c: int) -> tuple[int, int] | None:
    """0-based cell (other than (r, c)) holding the same digit as (r, c) in its row, column or box."""
    n = len(board)
    v = board[r][c]
    if not v:
        return None
    for cc in range(n):
        if cc != c and board[r][cc] == v:
            return r, cc
    for rr in range(n):
        if rr != r and board[rr][c] == v:
            return rr, c
    br, bc = BOX_SHAPES[n]
    r0, c0 = r - r % br, c - c % bc
    for rr in range(r0, r0 + br):
        for cc in range(c0, c0 + bc):
            if (rr, cc) != (r, c) and board[rr][cc] == v:
                return rr, cc
    return None


def candidates(board: Sequence[Sequence[int]], r: int, c: int) -> list[int]:
    """Digits (ascending) that (0-based) cell (r, c) could take without clashing with the rest of the board."""
    n = len(board)
    br, bc = BOX_SHAPES[n]
    r0, c0 = r - r % br, c - c % bc
    seen = {board[r][cc] for cc in range(n) if cc != c} | {board[rr][c] for rr in range(n) if rr != r}
    seen |= {board[rr][cc] for rr in range(r0, r0 + br) for cc in range(c0, c0 + bc) if (rr, cc) != (r, c)}
    return [v for v in range(1, n + 1) if v not in seen]


def _find_clash_any(board: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    n = len(board)
    for r in range(n):
        for c in range(n):
            if find_clash(board, r, c) is not None:
                return r, c
    return None


def _search(puzzle: Sequence[Sequence[int]], size: int, limit: int) -> list[list[list[int]]]:
    """Up to `limit` solutions by backtracking (bitmasks, most-constrained cell first)."""
    size = _check_size(size)
    grid = _as_grid(puzzle, size, "puzzle", allow_empty=True)
    full = (1 << (size + 1)) - 2  # bits 1..size
    rows, cols, boxes = [0] * size, [0] * size, [0] * size
    empties: list[tuple[int, int, int]] = []
    for r in range(size):
        for c in range(size):
            b, v = box_index(r, c, size), grid[r][c]
            if v == 0:
                empties.append((r, c, b))
                continue
            bit = 1 << v
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return []  # conflicting givens
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    solutions: list[list[list[int]]] = []

    def rec() -> bool:  # True = stop (limit reached)
        if not empties:
            solutions.append([row[:] for row in grid])
            return len(solutions) >= limit
        best_i, best_mask, best_n = -1, 0, size + 1
        for i, (r, c, b) in enumerate(empties):
            mask = full & ~(rows[r] | cols[c] | boxes[b])
            n = bin(mask).count("1")
            if n < best_n:
                best_i, best_mask, best_n = i, mask, n
                if n <= 1:
                    break
        if best_n == 0:
            return False
        r, c, b = empties[best_i]
        empties[best_i] = empties[-1]
        empties.pop()
        mask = best_mask
        while mask:
            bit = mask & -mask
            mask ^= bit
            grid[r][c] = bit.bit_length() - 1
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            if rec():
                return True
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
        grid[r][c] = 0
        empties.append((r, c, b))
        empties[best_i], empties[-1] = empties[-1], empties[best_i]
        return False

    rec()
    return solutions


def solve(puzzle: Sequence[Sequence[int]], size: int) -> list[list[int]] | None:
    """One solution of `puzzle` (0 = empty), or None if it has none."""
    found = _search(puzzle, size, limit=1)
    return found[0] if found else None


def count_solutions(puzzle: Sequence[Sequence[int]], size: int, limit: int = 2) -> int:
    """Number of solutions, counting stops at `limit`."""
    return len(_search(puzzle, size, limit=limit))


def oracle_move(board: Sequence[Sequence[int]], solution: Sequence[Sequence[int]] | None = None) -> str:
    """Canonical text of a correct move for the first empty cell (row-major), e.g. 'set 2 3 5' (why not the
    most constrained cell: results/design_notes.md)."""
    n = len(board)
    if solution is None:
        solution = solve(board, n)
        if solution is None:
            raise ValueError("board has no solution")
    for r in range(n):
        for c in range(n):
            if not board[r][c]:
                return f"set {r + 1} {c + 1} {solution[r][c]}"
    raise ValueError("board has no empty cell")
