"""Multi-turn text Sudoku: pure puzzle functions plus a Gymnasium environment.

The task of Agentic ESOpt's horizon benchmark: a random valid grid with exactly H* cells masked, one
`set r c v` move per turn, a turn cap of 3*H*, and a binary reward judged by the validity of the final
grid. Everything random draws from an explicit `np.random.Generator` (the env's own `np_random`); the
global `random` / `np.random` state is never touched.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from esopt.envs.base import AgentEnv
from esopt.envs.text_space import FreeText, ascii_text_space

# size -> (box rows, box cols)
BOX_SHAPES: dict[int, tuple[int, int]] = {4: (2, 2), 6: (2, 3), 9: (3, 3)}
# Only this many leading characters of an action are parsed (64 new tokens of a BPE model is ~250 chars).
MAX_PARSE_CHARS = 256
# The action space's max_length; longer text is still accepted by step() (and truncated when parsed).
MAX_ACTION_CHARS = 2048
# reward="shaped": the episode's shaped value is
#   SHAPED_WEIGHTS[0]*success + SHAPED_WEIGHTS[1]*progress + SHAPED_WEIGHTS[2]*valid_move_rate
SHAPED_WEIGHTS: tuple[float, float, float] = (0.5, 0.3, 0.2)
UNIQUE_TRIES = 20
USAGE = "set r c v"
_CELL_CHARS = ".123456789"
HINT_LEVELS = ("none", "empty", "candidates")


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


# ----------------------------------------------------------------------------------------- task data


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


# ------------------------------------------------------------------------------------ checking / solving


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
    """Canonical text of a correct move for the first empty cell (row-major), e.g. 'set 2 3 5'.

    (Tried: the most constrained cell instead. The tiny model's warm start learned it about half as
    well, 20% vs 43% per-move accuracy after 600-800 steps, so the simpler target stays.)"""
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


# ---------------------------------------------------------------------------------------- generation


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


# ------------------------------------------------------------------------------------------- parsing

_N = r"([0-9]+)"
_SET_RE = re.compile(rf"\bset\b\s*[:(\[]?\s*{_N}\s*[,\s]\s*{_N}\s*[,\s=]\s*{_N}", re.I | re.A)
_RC_RE = re.compile(
    rf"(?<![a-z])r(?:ow)?\s*{_N}\s*,?\s*c(?:ol(?:umn)?)?\s*{_N}\s*(?:=|:|,|\s|\bto\b)\s*(?:v(?:alue)?\s*=?\s*)?{_N}",
    re.I | re.A,
)
_BARE_RE = re.compile(rf"^[ \t(\[]*{_N}[ \t]*[, \t][ \t]*{_N}[ \t]*[, \t][ \t]*{_N}[ \t)\].]*$", re.M | re.A)
_JSON_RE = re.compile(r"\{[^{}]*\}")
_JSON_KEYS = {
    "row": ("row", "r"),
    "col": ("col", "c", "column"),
    "value": ("value", "v", "val", "digit", "number", "num"),
}
_PARSE_ERROR = ("bad format", f"invalid: could not parse; use: {USAGE}")


class _Err(tuple):
    """(short, long) feedback for a move that was not understood or is out of range."""


def _range_check(nums: Sequence[int], size: int) -> tuple[int, int, int] | _Err:
    for name, v in zip(("row", "column", "value"), nums):
        if not 1 <= v <= size:
            shown = str(v) if v < 1000 else ">999"
            return _Err((f"bad {name[:3]} {shown}", f"invalid: {name} {shown} out of range 1..{size}"))
    return int(nums[0]), int(nums[1]), int(nums[2])


def _json_nums(blob: str) -> list[int] | None:
    for text in (blob, blob.replace("'", '"')):
        try:
            obj = json.loads(text)
            break
        except ValueError:
            continue
    else:
        return None
    if not isinstance(obj, dict):
        return None
    lower = {str(k).strip().lower(): v for k, v in obj.items()}
    nums = []
    for aliases in _JSON_KEYS.values():
        v = next((lower[a] for a in aliases if a in lower), None)
        if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():
            v = int(v.strip())
        if isinstance(v, bool) or not isinstance(v, int):
            return None
        nums.append(v)
    return nums


def _parse(text: Any, size: int) -> tuple[int, int, int] | _Err:
    if text is None:
        return _Err(("empty", f"invalid: empty action; use: {USAGE}"))
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text[: 4 * MAX_PARSE_CHARS]).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        text = str(text)
    text = text[:MAX_PARSE_CHARS]
    if not text.strip():
        return _Err(("empty", f"invalid: empty action; use: {USAGE}"))
    found: list[tuple[int, tuple[int, int, int] | _Err]] = []
    for pattern in (_SET_RE, _RC_RE, _BARE_RE):
        for m in pattern.finditer(text):
            found.append((m.start(), _range_check([int(g) for g in m.groups()], size)))
    for m in _JSON_RE.finditer(text):
        nums = _json_nums(m.group(0))
        if nums is not None:
            found.append((m.start(), _range_check(nums, size)))
    found.sort(key=lambda item: (item[0], isinstance(item[1], _Err)))
    for _, result in found:
        if not isinstance(result, _Err):
            return result
    return found[0][1] if found else _Err(_PARSE_ERROR)


def parse_action(text: Any, size: int) -> tuple[int, int, int] | str:
    """Parse one move into 1-indexed (row, col, value), or return an error message. Never raises.

    Accepts `set r c v` (also `set r,c,v`, any case), `r2c3=5`, `r2 c3 5`, `2 3 5` (alone on a line) and
    JSON `{"row":2,"col":3,"value":5}` (or keys r/c/v). Only the first MAX_PARSE_CHARS characters are
    read; the earliest valid move wins, else the earliest out-of-range error, else a usage message.
    """
    try:
        result = _parse(text, size)
    except Exception:  # defensive: the parser must never take a rollout down
        return _PARSE_ERROR[1]
    return result[1] if isinstance(result, _Err) else result


# ----------------------------------------------------------------------------------------- environment


class SudokuEnv(AgentEnv):
    """Multi-turn text Sudoku for LLM agents.

    ## Description
    A random valid size x size grid (4x4 with 2x2 boxes, 6x6 with 2x3 boxes, 9x9 with 3x3 boxes) has exactly
    `h_star` cells masked; H* is the minimum number of turns needed. Each turn the agent writes one digit.

    ## Action
    Free text (`FreeText` space: any str). The first move found is used: `set r c v` (canonical; 1-indexed
    row, column, value), `r2c3=5`, `r2 c3 5`, `2 3 5` or JSON `{"row":2,"col":3,"value":5}`. Writing an
    empty cell is valid even if it clashes with a row/column/box (the feedback says so). Unparsable text,
    out-of-range numbers, givens and filled cells (unless `allow_overwrite`; givens never) are invalid:
    the turn is used and the board is unchanged.

    ## Observation
    ASCII text: one line per row, `"{row} {cells}"` with '.' for empty, then `"{feedback} t{turns_left}"`.
    4x4 example (34 chars)::

        1 12.4
        2 .4.2
        3 3.2.
        4 2.1.
        ok t12

    Feedback: new, ok, clash r2c4, given r1c2, filled r1c2, bad row 7, bad format, empty, solved, wrong.
    Every step changes the observation (turns left drops). With `allow_overwrite=True` givens and written
    digits look alike, so the observation is Markov only together with the first observation.

    ## Starting state
    A puzzle drawn from `self.np_random` (same seed => same puzzle), or `options={"task": SudokuTask}` /
    `options={"puzzle": ..., "solution": ...}` (then H* = number of empty cells), or
    `options={"h_star": k}` for one episode with another H*.

    ## Rewards
    `reward="binary"` (default): 1.0 at termination if the grid is a valid solution, else 0.
    `reward="shaped"`: the per-step difference of the episode value
    S = 0.5*success + 0.3*progress + 0.2*valid_move_rate (S = 0 at reset, so the rewards sum to the final S),
    where progress = fraction of the originally empty cells that are filled and clash with no other cell and
    valid_move_rate = valid moves / turns used. `info["shaped_reward"]` always holds the running S.

    ## Episode end
    Terminated when the board is full (success iff it is a valid solution). Truncated after
    ceil(turn_cap_factor * H*) turns. Stepping a finished episode raises RuntimeError.

    ## Arguments
    size (4, 6, 9), h_star (1..size*size), turn_cap_factor (>= 1), reward ("binary" | "shaped"),
    allow_overwrite (rewrite non-given cells), unique (uniquely solvable puzzles), hints (what the
    observation adds before the status line: "none"; "empty" lists the empty cells as `empty: 2 1, 3 4`, row
    then column, which a smaller model needs to find the cells; "candidates" also lists each empty cell's
    digits that clash with nothing on the current board, `empty: 2 1 [3 4], 3 4 [1]`), show_empty (old
    name: true means hints="empty"), render_mode (None | "ansi").

    ## Versions
    v0: initial version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        size: int = 9,
        h_star: int = 5,
        turn_cap_factor: float = 3,
        reward: str = "binary",
        allow_overwrite: bool = False,
        unique: bool = False,
        hints: str = "none",
        show_empty: bool = False,
        render_mode: str | None = None,
    ) -> None:
        self.size = _check_size(size)
        self.h_star = _check_h_star(h_star, self.size)
        if (
            isinstance(turn_cap_factor, bool)
            or not isinstance(turn_cap_factor, Real)
            or not (1 <= turn_cap_factor < math.inf)
        ):
            raise ValueError(f"turn_cap_factor must be a finite number >= 1, got {turn_cap_factor!r}")
        if reward not in ("binary", "shaped"):
            raise ValueError(f"reward must be 'binary' or 'shaped', got {reward!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.turn_cap_factor = turn_cap_factor
        self.reward_mode = reward
        self.allow_overwrite = bool(allow_overwrite)
        self.unique = bool(unique)
        if hints not in HINT_LEVELS:
            raise ValueError(f"hints must be one of {list(HINT_LEVELS)}, got {hints!r}")
        self.hints = "empty" if show_empty and hints == "none" else hints
        self.render_mode = render_mode
        self.box_shape = BOX_SHAPES[self.size]

        n = self.size
        max_status = len("bad val >999") + len(" t") + len(str(self._cap(n * n)))
        self.action_space = FreeText(MAX_ACTION_CHARS)
        per_cell = {"none": 0, "empty": len("9 9, "), "candidates": len("9 9 [] , ") + 2 * n}[self.hints]
        empty_line = len("empty: ") + per_cell * n * n
        self.observation_space = ascii_text_space(n * (n + 3) + empty_line + max_status)
        br, bc = self.box_shape
        self.instructions = (
            f"Sudoku {n}x{n} ({br}x{bc} boxes): make every row, column and box hold 1-{n}. Each board line is "
            "a row number then its cells ('.' = empty), the last line is feedback and turns left; reply with "
            f"one move: {USAGE} (row, column, value, 1-indexed)."
        )

        # episode state (set by reset)
        self.task: SudokuTask | None = None
        self._board: list[list[int]] = []
        self._holes: list[tuple[int, int]] = []
        self._turn_cap = 0
        self._turn = 0
        self._valid_moves = 0
        self._short = ""
        self._feedback = ""
        self._shaped = 0.0
        self._success = False
        self._done = False

    # -- helpers
    def _cap(self, h: int) -> int:
        return max(h, math.ceil(self.turn_cap_factor * h - 1e-9))

    @property
    def board(self) -> list[list[int]]:
        """A copy of the current board (0 = empty)."""
        return [row[:] for row in self._board]

    @property
    def turn_cap(self) -> int:
        return self._turn_cap

    def _holes_left(self) -> int:
        return sum(1 for r, c in self._holes if not self._board[r][c])

    def _progress(self) -> float:
        good = sum(1 for r, c in self._holes if self._board[r][c] and find_clash(self._board, r, c) is None)
        return good / len(self._holes)

    def _shaped_value(self) -> float:
        if self._turn == 0:
            return 0.0
        ws, wp, wv = SHAPED_WEIGHTS
        return ws * float(self._success) + wp * self._progress() + wv * self._valid_moves / self._turn

    def _is_correct(self, r: int, c: int, v: int) -> bool:
        """The digit of the (1-indexed) move is the solution's (no clash, for tasks given without one)."""
        if self.task.solution is not None:
            return self.task.solution[r - 1][c - 1] == v
        return find_clash(self._board, r - 1, c - 1) is None

    def _obs(self) -> str:
        # Tried: status line first (board at a fixed distance from the reply). The tiny model's warm start
        # learned it worse (25% vs 43% per-move accuracy), so the status line stays last.
        lines = [f"{r + 1} " + "".join(_CELL_CHARS[v] for v in row) for r, row in enumerate(self._board)]
        if self.hints != "none":  # the open cells as "row col" pairs, in the move's own order
            empty = [f"{r + 1} {c + 1}" + self._candidates_text(r, c)
                     for r, row in enumerate(self._board) for c, v in enumerate(row) if not v]
            lines.append("empty: " + ", ".join(empty))
        lines.append(f"{self._short} t{self._turn_cap - self._turn}")
        return "\n".join(lines)

    def _candidates_text(self, r: int, c: int) -> str:
        if self.hints != "candidates":
            return ""
        return " [" + " ".join(str(v) for v in candidates(self._board, r, c)) + "]"

    def _info(self, valid: bool, move: tuple[int, int, int] | None) -> dict[str, Any]:
        return {
            "is_success": self._success,
            "action_is_valid": valid,
            "action_is_correct": valid and move is not None and self._is_correct(*move),
            "turn": self._turn,
            "turns_left": self._turn_cap - self._turn,
            "turn_cap": self._turn_cap,
            "h_star": len(self._holes),
            "holes_left": self._holes_left(),
            "progress": self._progress(),
            "shaped_reward": self._shaped,
            "feedback": self._feedback,
            "move": move,
        }

    def _task_from_options(self, options: Mapping[str, Any]) -> SudokuTask:
        unknown = set(options) - {"task", "puzzle", "solution", "h_star"}
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; use task, puzzle/solution or h_star")
        if options.get("task") is not None:
            task = options["task"]
            if not isinstance(task, SudokuTask):
                task = SudokuTask.from_json(task, size=self.size)
        elif options.get("puzzle") is not None:
            data = {"puzzle": options["puzzle"], "solution": options.get("solution")}
            task = SudokuTask.from_json(data, size=self.size)
        else:
            h_star = _check_h_star(options.get("h_star", self.h_star), self.size)
            return generate_task(self.np_random, self.size, h_star, self.unique)
        if task.size != self.size:
            raise ValueError(f"task size {task.size} does not match the env size {self.size}")
        if task.h_star == 0:
            raise ValueError("puzzle has no empty cell")
        return task

    # -- Gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.task = self._task_from_options(options or {})
        self._board = [row[:] for row in self.task.puzzle]
        self._holes = [(r, c) for r in range(self.size) for c in range(self.size) if not self._board[r][c]]
        self._turn_cap = self._cap(len(self._holes))
        self._turn = self._valid_moves = 0
        self._short, self._feedback = "new", "new puzzle"
        self._shaped, self._success, self._done = 0.0, False, False
        return self._obs(), self._info(valid=True, move=None)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._board:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        self._turn += 1
        parsed = _parse_safe(action, self.size)
        valid, move = False, None
        if isinstance(parsed, _Err):
            self._short, self._feedback = parsed
        else:
            move = parsed
            r, c, v = move
            cell = f"r{r}c{c}"
            if self.task.puzzle[r - 1][c - 1]:
                self._short, self._feedback = f"given {cell}", f"invalid: cell {cell} is a given"
            elif self._board[r - 1][c - 1] and not self.allow_overwrite:
                self._short, self._feedback = f"filled {cell}", f"invalid: cell {cell} is already filled"
            else:
                valid = True
                self._board[r - 1][c - 1] = v
                clash = find_clash(self._board, r - 1, c - 1)
                if clash is None:
                    self._short, self._feedback = "ok", f"ok: {cell}={v}"
                else:
                    other = f"r{clash[0] + 1}c{clash[1] + 1}"
                    self._short, self._feedback = f"clash {other}", f"ok: {cell}={v} clashes with {other}"
        self._valid_moves += valid

        terminated = self._holes_left() == 0
        truncated = not terminated and self._turn >= self._turn_cap
        if terminated:
            self._success = is_valid_solution(self._board, self.task.puzzle)
            self._short = "solved" if self._success else "wrong"
            self._feedback += "; solved" if self._success else "; board full but not a valid solution"
        self._done = terminated or truncated

        previous, self._shaped = self._shaped, self._shaped_value()
        if self.reward_mode == "shaped":
            reward = self._shaped - previous
        else:
            reward = 1.0 if self._success else 0.0
        return self._obs(), float(reward), terminated, truncated, self._info(valid=valid, move=move)

    def worked_examples(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        """`count` worked exchanges for few-shot prompts: (first observation of a puzzle, a correct move).

        The puzzles come from their own seed stream (never a training or held-out task), with this env's
        size and H*. The move fills a random empty cell, not the oracle's first one, so a model that
        copies the examples' coordinates gains nothing from it. The env's own state is not touched."""
        rng = np.random.default_rng([int(seed), self.size, self.h_star, 0x5EED])
        env = SudokuEnv(self.size, self.h_star, self.turn_cap_factor, self.reward_mode, self.allow_overwrite,
                        hints=self.hints)
        out = []
        for _ in range(count):
            task = generate_task(rng, self.size, self.h_star)
            obs, _ = env.reset(options={"task": task})
            r, c = env._holes[int(rng.integers(len(env._holes)))]
            out.append((obs, f"set {r + 1} {c + 1} {task.solution[r][c]}"))
        return out

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() called with render_mode=None; create the env with render_mode='ansi'")
            return None
        return self._obs() if self._board else ""


def _parse_safe(action: Any, size: int) -> tuple[int, int, int] | _Err:
    try:
        return _parse(action, size)
    except Exception:
        return _Err(_PARSE_ERROR)
