"""Multi-turn text Sudoku: puzzle rules and solver (`grid.py`), task data and generation (`tasks.py`),
the move parser (`parse.py`) and the Gymnasium environment (`env.py`).

The task of Agentic ESOpt's horizon benchmark: a random valid grid with exactly H* cells masked, one
`set r c v` move per turn, a turn cap of 3*H*, and a binary reward judged by the validity of the final
grid. Everything random draws from an explicit `np.random.Generator` (the env's own `np_random`); the
global `random` / `np.random` state is never touched.
"""

from esopt.envs.sudoku.env import HINT_LEVELS, SHAPED_WEIGHTS, SudokuEnv
from esopt.envs.sudoku.grid import (
    BOX_SHAPES,
    box_index,
    candidates,
    count_solutions,
    find_clash,
    is_valid_solution,
    oracle_move,
    solve,
)
from esopt.envs.sudoku.parse import MAX_PARSE_CHARS, USAGE, parse_action
from esopt.envs.sudoku.tasks import (
    SudokuTask,
    generate_task,
    load_tasks_jsonl,
    make_task_set,
    save_tasks_jsonl,
)

__all__ = ["BOX_SHAPES", "HINT_LEVELS", "MAX_PARSE_CHARS", "SHAPED_WEIGHTS", "USAGE", "SudokuEnv", "SudokuTask",
           "box_index", "candidates", "count_solutions", "find_clash", "generate_task", "is_valid_solution",
           "load_tasks_jsonl", "make_task_set", "oracle_move", "parse_action", "save_tasks_jsonl", "solve"]
