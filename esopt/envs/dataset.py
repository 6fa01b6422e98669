"""A dataset of prompts scored by reward functions, as a one-turn agent env (what `esopt.ESTrainer` trains on).

Rows are dicts with a `prompt`: a string (plain: the model continues the text as it is, no chat template) or a
list of chat messages (conversational: rendered with the model's chat template). Every other column is handed
to the reward functions, which follow TRL's convention:

    def reward(prompts, completions, **columns) -> list[float | None]

called with lists of one element here (one episode is one completion); completions are strings for plain
prompts and `[{"role": "assistant", "content": text}]` for conversational ones, as in TRL. `None` means "this
function does not score this completion": the reward is the weighted sum of the functions that did (TRL's
nansum), 0 if none did. The reward functions are the task's code, not the model's: they run in this process.

The task for seed s is row s mod N of the train rows; seeds listed in `heldout_rows` pick the held-out rows
(the trainer maps each eval seed to one eval row, so an eval visits every row once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from esopt.envs.base import AgentEnv
from esopt.envs.text_space import FreeText

RewardFunc = Callable[..., Sequence[float | None]]


def is_conversational(prompt: Any) -> bool:
    """A list of {"role", "content"} messages (TRL's conversational format), not a plain string."""
    return isinstance(prompt, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m
                                            for m in prompt) and bool(prompt)


def check_rows(rows: Sequence[Mapping[str, Any]], what: str) -> None:
    """Every row has a string or chat `prompt` (one line naming the first row that does not)."""
    if len(rows) == 0:
        raise ValueError(f"{what} has no rows")
    for i, row in enumerate(rows):
        prompt = row.get("prompt") if isinstance(row, Mapping) else None
        if not isinstance(prompt, str) and not is_conversational(prompt):
            raise ValueError(f"{what} row {i}: needs a 'prompt' column holding a string or a list of "
                             f"{{'role', 'content'}} messages, got {type(prompt).__name__}")


def reward_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", type(func).__name__)


def score_completion(reward_funcs: Sequence[RewardFunc], weights: Sequence[float], prompt: Any, completion: Any,
                     columns: Mapping[str, Any]) -> tuple[float, dict[str, float | None]]:
    """(weighted reward, each function's own value) of one completion, TRL's way: None skips a function."""
    values: dict[str, float | None] = {}
    total = 0.0
    for func, weight in zip(reward_funcs, weights):
        out = func(prompts=[prompt], completions=[completion], **{k: [v] for k, v in columns.items()})
        try:  # a list, tuple, numpy array or tensor of one value per completion
            returned = list(out) if not isinstance(out, (str, bytes, Mapping)) else None
        except TypeError:
            returned = None
        if returned is None or len(returned) != 1:
            raise ValueError(f"reward function {reward_name(func)} returned {out!r}: it must return a list with one "
                             "float (or None) per completion")
        value = returned[0]
        if value is not None:
            value = float(value)
            if math.isnan(value):
                value = None
            else:
                total += weight * value
        values[reward_name(func)] = value
    return total, values


class RowScorer:
    """What both dataset envs share: the row of a task seed (held-out seeds pick held-out rows, others row s mod N)
    and a completion's weighted reward from the reward functions and the row's other columns."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], reward_funcs: Sequence[RewardFunc],
                 reward_weights: Sequence[float] | None = None, heldout: Sequence[Mapping[str, Any]] = (),
                 heldout_rows: Mapping[int, int] | None = None, success_threshold: float = 1.0) -> None:
        check_rows(rows, "train_dataset")
        if heldout_rows and not heldout:
            raise ValueError("heldout_rows given without held-out rows")
        weights = [1.0] * len(reward_funcs) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(reward_funcs):
            raise ValueError(f"{len(weights)} reward_weights for {len(reward_funcs)} reward functions")
        self.rows, self.heldout, self.heldout_rows = rows, heldout, dict(heldout_rows or {})
        self.reward_funcs, self.weights, self.success_threshold = list(reward_funcs), weights, success_threshold

    def row(self, seed: int) -> Mapping[str, Any]:
        return self.heldout[self.heldout_rows[seed]] if seed in self.heldout_rows else self.rows[seed % len(self.rows)]

    def score(self, row: Mapping[str, Any], completion: Any, **extra: Any) -> tuple[float, dict[str, float | None]]:
        columns = {k: v for k, v in row.items() if k != "prompt"}
        return score_completion(self.reward_funcs, self.weights, row["prompt"], completion, {**columns, **extra})


class PromptDatasetEnv(AgentEnv):
    """One turn: reset shows a row's prompt, step scores the completion with the reward functions and ends."""

    metadata = {"render_modes": []}
    instructions = "Answer the prompt."  # unused: each row's prompt is the whole opening (info["prompt"])

    def __init__(self, rows: Sequence[Mapping[str, Any]], reward_funcs: Sequence[RewardFunc],
                 reward_weights: Sequence[float] | None = None, heldout: Sequence[Mapping[str, Any]] = (),
                 heldout_rows: Mapping[int, int] | None = None, success_threshold: float = 1.0) -> None:
        if not reward_funcs:
            raise ValueError("reward_funcs is empty: give at least one reward function")
        self.scorer = RowScorer(rows, reward_funcs, reward_weights, heldout, heldout_rows, success_threshold)
        self.observation_space = FreeText(max_length=1_000_000)
        self.action_space = FreeText(max_length=1_000_000)
        self.row: Mapping[str, Any] = rows[0]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.row = self.scorer.row(int(seed or 0))
        prompt = self.row["prompt"]
        obs = prompt[-1]["content"] if is_conversational(prompt) else prompt
        return str(obs), {"prompt": prompt, "is_success": False, "action_is_valid": True}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        prompt = self.row["prompt"]
        completion = [{"role": "assistant", "content": action}] if is_conversational(prompt) else action
        reward, values = self.scorer.score(self.row, completion)
        info = {"is_success": reward >= self.scorer.success_threshold, "action_is_valid": True,
                "shaped_reward": reward, "rewards": values}
        return "", reward, True, False, info
