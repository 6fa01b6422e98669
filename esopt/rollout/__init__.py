"""The multi-turn rollout engine shared by ES, GRPO and PPO: episodes in lockstep over one batched engine
call per turn (`engine.py`), their prompts (`prompts.py`), what comes back (`trajectory.py`) and the
resolved settings of a run's rollouts (`spec.py`)."""

from esopt.rollout.engine import run_episodes, turn_seed
from esopt.rollout.prompts import (
    Examples,
    Message,
    build_markov_prompt,
    count_tokens,
    env_examples,
    markov_messages,
    resolve_system_prompt,
)
from esopt.rollout.spec import RolloutSpec
from esopt.rollout.trajectory import RolloutStats, Trajectory, Turn, summarize, trajectory_score

__all__ = ["Examples", "Message", "RolloutSpec", "RolloutStats", "Trajectory", "Turn", "build_markov_prompt",
           "count_tokens", "env_examples", "markov_messages", "resolve_system_prompt", "run_episodes", "summarize",
           "trajectory_score", "turn_seed"]
