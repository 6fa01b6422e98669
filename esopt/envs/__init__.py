"""Gymnasium text environments. Importing this package registers them.

`gymnasium.make` keeps its default wrappers: the passive env checker and order enforcing both work with
text spaces (the checker asserts `obs in observation_space`, which holds: observations are printable
ASCII, and it never checks actions). No TimeLimit wrapper is registered: the turn cap depends on each
episode's H*, so the env truncates itself.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from esopt.envs.sudoku import SudokuEnv

SUDOKU_ID = "esopt/Sudoku-v0"
ENV_IDS: list[str] = [SUDOKU_ID]

if SUDOKU_ID not in gymnasium.registry:  # re-import safe (no "overriding environment" warning)
    gymnasium.register(SUDOKU_ID, entry_point="esopt.envs.sudoku:SudokuEnv")


def make_env(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """`gymnasium.make(env_id, **kwargs)` with this package's envs registered."""
    return gymnasium.make(env_id, **kwargs)


__all__ = ["ENV_IDS", "SUDOKU_ID", "SudokuEnv", "make_env"]
