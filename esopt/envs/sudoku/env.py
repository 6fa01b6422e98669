"""`SudokuEnv`, the multi-turn text environment (esopt/Sudoku-v0)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

import gymnasium as gym
import numpy as np

from esopt.envs.base import AgentEnv
from esopt.envs.sudoku.grid import (
    BOX_SHAPES,
    _check_h_star,
    _check_size,
    candidates,
    find_clash,
    is_valid_solution,
)
from esopt.envs.sudoku.parse import USAGE, _Err, _parse_safe
from esopt.envs.sudoku.tasks import SudokuTask, generate_task
from esopt.envs.text_space import FreeText, ascii_text_space

# The action space's max_length; longer text is still accepted by step() (and truncated when parsed).
MAX_ACTION_CHARS = 2048
# reward="shaped": the episode's shaped value is
#   SHAPED_WEIGHTS[0]*success + SHAPED_WEIGHTS[1]*progress + SHAPED_WEIGHTS[2]*valid_move_rate
SHAPED_WEIGHTS: tuple[float, float, float] = (0.5, 0.3, 0.2)
_CELL_CHARS = ".123456789"
HINT_LEVELS = ("none", "empty", "candidates")
EXAMPLE_MODES = ("first", "episode")  # worked examples: one first move per puzzle, or a whole solved episode

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
    name: true means hints="empty"), examples ("first": each worked example is a puzzle's first observation
    and one correct move; "episode": every exchange of a solved episode, H* turns of feedback and moves, so
    a few-shot prompt shows the task carried over turns), render_mode (None | "ansi").

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
        examples: str = "first",
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
        if examples not in EXAMPLE_MODES:
            raise ValueError(f"examples must be one of {list(EXAMPLE_MODES)}, got {examples!r}")
        self.examples = examples
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
        # the status line stays last (why: results/design_notes.md)
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
        """Worked exchanges for few-shot prompts, (observation, correct move) pairs from `count` puzzles:
        each puzzle's first observation and one move (`examples="first"`), or every exchange of the puzzle
        solved turn by turn (`examples="episode"`, H* pairs per puzzle, in order).

        The puzzles come from their own seed stream (never a training or held-out task), with this env's
        size and H*. Moves fill the empty cells in a random order, not the oracle's, so a model that
        copies the examples' coordinates gains nothing from it. The env's own state is not touched."""
        rng = np.random.default_rng([int(seed), self.size, self.h_star, 0x5EED])
        env = SudokuEnv(self.size, self.h_star, self.turn_cap_factor, self.reward_mode, self.allow_overwrite,
                        hints=self.hints)
        out = []
        for _ in range(count):
            task = generate_task(rng, self.size, self.h_star)
            obs, _ = env.reset(options={"task": task})
            if self.examples == "first":
                r, c = env._holes[int(rng.integers(len(env._holes)))]
                out.append((obs, f"set {r + 1} {c + 1} {task.solution[r][c]}"))
                continue
            for k in rng.permutation(len(env._holes)):
                r, c = env._holes[int(k)]
                move = f"set {r + 1} {c + 1} {task.solution[r][c]}"
                out.append((obs, move))
                obs = env.step(move)[0]
        return out

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() called with render_mode=None; create the env with render_mode='ansi'")
            return None
        return self._obs() if self._board else ""
