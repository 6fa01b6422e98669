"""Gymnasium text environments. Importing this package registers them.

`gymnasium.make` keeps its default wrappers: the passive env checker and order enforcing both work with
text spaces (the checker asserts `obs in observation_space`, which holds: observations are printable
ASCII, and it never checks actions). No TimeLimit wrapper is registered: the turn cap depends on each
episode's H*, so the env truncates itself.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium

from esopt.envs.base import AgentEnv, EnvContractError, check_env
from esopt.envs.sudoku import SudokuEnv

SUDOKU_ID = "esopt/Sudoku-v0"
MATH_ID = "esopt/MathTool-v0"
DOCQA_ID = "esopt/DocQA-v0"
WEB_ID = "esopt/Web-v0"
MINIWOB_ID = "esopt/MiniWoB-v0"
ENTRY_POINTS = {SUDOKU_ID: "esopt.envs.sudoku:SudokuEnv", MATH_ID: "esopt.envs.math_tools:MathToolEnv",
                DOCQA_ID: "esopt.envs.docqa:DocQAEnv", WEB_ID: "esopt.envs.web.env:WebEnv",
                MINIWOB_ID: "esopt.envs.web.miniwob:MiniWoBEnv"}
ENV_IDS: list[str] = list(ENTRY_POINTS)

for _id, _entry in ENTRY_POINTS.items():
    if _id not in gymnasium.registry:  # re-import safe (no "overriding environment" warning)
        gymnasium.register(_id, entry_point=_entry)


def make_env(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """`gymnasium.make(env_id, **kwargs)` with this package's envs registered. An unknown id or an
    argument the env does not take is a ValueError naming it (one line, no traceback at the CLI)."""
    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error:
        raise ValueError(f"unknown env id {env_id!r}; registered esopt envs: {ENV_IDS}") from None
    try:
        return gymnasium.make(spec, **kwargs)
    except TypeError as e:
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        what = f"unknown argument {bad.group(1)!r}" if bad else (str(e).splitlines() or ["bad arguments"])[0]
        raise ValueError(f"env {env_id}: {what} (env kwargs given: {sorted(kwargs)})") from None


__all__ = [
    "DOCQA_ID",
    "ENV_IDS",
    "MATH_ID",
    "MINIWOB_ID",
    "SUDOKU_ID",
    "WEB_ID",
    "AgentEnv",
    "EnvContractError",
    "SudokuEnv",
    "check_env",
    "make_env",
]
