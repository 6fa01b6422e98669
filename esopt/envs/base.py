"""The contract every esopt environment keeps: what the rollout engine and the trainers rely on.

An agent env is a Gymnasium env with text observations and text actions (`reset(seed=...) -> (obs,
info)`, `step(action) -> (obs, reward, terminated, truncated, info)`) plus:

- `instructions: str`, the task description an agent gets as its system prompt;
- in every step's info: `is_success` (bool: the episode's goal is reached) and `action_is_valid` (bool:
  the env accepted the action; model output is untrusted, so any text must be accepted as input);
- optional info keys, used when present: `shaped_reward` (float, the running dense score that
  `reward: shaped` trains on), `action_is_correct` (bool), `feedback` (str);
- optionally `worked_examples(count, seed) -> [(observation, action)]` for few-shot prompts;
- optionally `stop_strings: list[str]`, strings that end the model's turn (a ReAct tool call's closing tag);
  the rollout engine adds them to the sampling's own `stop`.
- optionally `prompt` in reset's info: the episode's whole opening (a dataset row's prompt), a string the model
  continues as it is or a list of chat messages; the first turn's prompt is then that, not the env's
  instructions and observation.

`check_env` verifies all of it on a live env; the test suite runs it over every registered id.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

REQUIRED_INFO = {"is_success": bool, "action_is_valid": bool}
OPTIONAL_INFO = {"shaped_reward": float, "action_is_correct": bool, "feedback": str}
PROBE_ACTIONS = ("", "hello", "set 1 1 1", "\x00\n" * 3, "9" * 500)  # untrusted text of every shape


class EnvContractError(ValueError):
    """An env breaks the agent-env contract (one line naming the env and what is wrong)."""


class AgentEnv(gym.Env[str, str]):
    """Base class of esopt's text envs (subclassing is optional: `check_env` checks behaviour)."""

    instructions: str = ""

    def worked_examples(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        raise NotImplementedError(f"{type(self).__name__} has no worked examples: set env.few_shot to 0")


def _check_info(name: str, info: dict[str, Any], where: str) -> None:
    for key in REQUIRED_INFO:
        if key not in info:
            raise EnvContractError(f"{name}: info after {where} lacks {key!r}")
    for key, kind in {**REQUIRED_INFO, **OPTIONAL_INFO}.items():
        if key in info and not isinstance(info[key], kind if kind is not float else (int, float)):
            raise EnvContractError(f"{name}: info[{key!r}] after {where} is {type(info[key]).__name__}, "
                                   f"expected {kind.__name__}")


def check_env(env: gym.Env, seed: int = 0, max_steps: int = 8) -> None:
    """Reset and step `env` with probe actions, raising `EnvContractError` on the first breach."""
    raw = env.unwrapped
    name = env.spec.id if env.spec else type(raw).__name__
    if not isinstance(getattr(raw, "instructions", None), str) or not raw.instructions.strip():
        raise EnvContractError(f"{name}: needs a non-empty `instructions` string (the agent's system prompt)")
    obs, info = env.reset(seed=seed)
    if not isinstance(obs, str):
        raise EnvContractError(f"{name}: reset() returned a {type(obs).__name__} observation, expected str")
    again, _ = env.reset(seed=seed)
    if again != obs:
        raise EnvContractError(f"{name}: reset(seed={seed}) is not deterministic")
    for k in range(max_steps):
        action = PROBE_ACTIONS[k % len(PROBE_ACTIONS)]
        obs, reward, terminated, truncated, info = env.step(action)
        where = f"step({action[:12]!r})"
        if not isinstance(obs, str):
            raise EnvContractError(f"{name}: {where} returned a {type(obs).__name__} observation, expected str")
        if not isinstance(reward, (int, float)):
            raise EnvContractError(f"{name}: {where} returned a {type(reward).__name__} reward, expected a number")
        _check_info(name, info, where)
        if terminated or truncated:
            break
    examples = getattr(raw, "worked_examples", None)
    if examples is not None:
        try:
            pairs = examples(2, seed=seed)
        except NotImplementedError:
            return
        if not all(isinstance(o, str) and isinstance(a, str) for o, a in pairs):
            raise EnvContractError(f"{name}: worked_examples must return (observation, action) string pairs")
