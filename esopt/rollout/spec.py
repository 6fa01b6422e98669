"""`RolloutSpec`: what a rollout needs besides the engine, the envs and the tasks, resolved once at set-up
(sampling, conversation mode, system prompt, worked examples, batch and token budgets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym

from esopt.engines.base import Engine, SamplingParams
from esopt.rollout.engine import run_episodes
from esopt.rollout.trajectory import RolloutStats, Trajectory


@dataclass(frozen=True)
class RolloutSpec:
    sampling: SamplingParams = SamplingParams()
    conversation: Literal["markov", "history"] = "markov"
    system_prompt: str | None = None  # None: each env's own instructions
    examples: tuple[tuple[str, str], ...] = ()  # worked (observation, action) exchanges before each episode
    max_batch_size: int | None = None  # prompts per generate call
    max_prompt_tokens: int | None = None  # history mode: the oldest exchanges are dropped to fit
    max_episode_tokens: int | None = None  # an episode is truncated once it generated this many tokens

    def replace(self, **changes) -> RolloutSpec:
        return dataclasses.replace(self, **changes)

    def run(self, engine: Engine, make_env: Callable[[], gym.Env], task_seeds: list[int], seed: int,
            members: Sequence[int] | None = None, progress: bool = False) -> tuple[list[Trajectory], RolloutStats]:
        """One episode per task seed, in lockstep (`run_episodes`); `members`: see there."""
        return run_episodes(engine, make_env, task_seeds, self.sampling, seed=seed, conversation=self.conversation,
                            system_prompt=self.system_prompt, max_batch_size=self.max_batch_size,
                            examples=self.examples, max_prompt_tokens=self.max_prompt_tokens, members=members,
                            max_episode_tokens=self.max_episode_tokens, progress=progress)
