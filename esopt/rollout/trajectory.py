"""What a rollout returns: turns, trajectories, rollout stats, and the scalar scores taken from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One agent turn: the prompt it saw, what it generated, and what the env answered."""

    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]  # generated ids, exactly as produced (EOS kept if produced)
    text: str
    logprobs: list[float] | None
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    observation: str = ""  # the env's observation this turn answered (the prompt's last user message)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class Trajectory:
    """One episode on one task seed."""

    task_seed: int
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0  # sum of turn rewards
    success: bool = False  # `is_success` of the last info
    num_turns: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    @property
    def terminated(self) -> bool:
        return bool(self.turns) and self.turns[-1].terminated

    @property
    def truncated(self) -> bool:
        return bool(self.turns) and self.turns[-1].truncated

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    @property
    def valid_action_rate(self) -> float:
        """Fraction of turns whose action the env accepted (`action_is_valid`); 0 for no turns."""
        if not self.turns:
            return 0.0
        return sum(bool(t.info.get("action_is_valid", False)) for t in self.turns) / len(self.turns)

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)
        self.reward += float(turn.reward)
        self.success = bool(turn.info.get("is_success", False))
        self.num_turns += 1
        self.prompt_tokens += len(turn.prompt_ids)
        self.generated_tokens += len(turn.token_ids)


@dataclass
class RolloutStats:
    episodes: int = 0
    turns: int = 0  # agent turns summed over episodes
    generated_tokens: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0  # wall clock of the whole rollout
    generate_seconds: float = 0.0  # time inside policy.generate

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per wall-clock second of the whole rollout (env and prompts included)."""
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


def trajectory_score(t: Trajectory, kind: str) -> float:
    """One episode's scalar: the env reward, binary success, or the env's shaped reward."""
    if kind == "success":
        return float(t.success)
    if kind == "shaped":
        return float(t.turns[-1].info.get("shaped_reward", 0.0)) if t.turns else 0.0
    return float(t.reward)


def summarize(trajectories: list[Trajectory]) -> dict[str, float]:
    """Episode means; `correct_given_valid` pools turns: correct actions / valid actions (format-only
    gains raise the valid-action rate without it)."""
    n = max(len(trajectories), 1)
    turns = [turn for t in trajectories for turn in t.turns]
    valid = sum(bool(turn.info.get("action_is_valid", False)) for turn in turns)
    correct = sum(bool(turn.info.get("action_is_correct", False)) for turn in turns)
    return {
        "success_rate": sum(t.success for t in trajectories) / n,
        "mean_reward": sum(t.reward for t in trajectories) / n,
        "mean_turns": sum(t.num_turns for t in trajectories) / n,
        "valid_action_rate": sum(t.valid_action_rate for t in trajectories) / n,
        "correct_given_valid": correct / valid if valid else 0.0,
        "shaped_reward": sum(trajectory_score(t, "shaped") for t in trajectories) / n,
    }
