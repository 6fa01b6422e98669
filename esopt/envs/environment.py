"""TRL's `environment_factory` contract as a multi-turn esopt env: the same environment class trains with
`trl.GRPOTrainer(environment_factory=Cls)` and with `esopt.ESTrainer(environment_factory=Cls)`.

The contract (TRL 1.16): `Cls()` makes one environment per episode; `reset(**row)` gets every column of the
episode's dataset row and returns None or text that is appended to the row's last user message; every public
method (not `reset`, not `get_reward`, not starting with `_`) is a tool, described by its type hints and
Google-style docstring (`transformers.utils.get_json_schema`, as TRL does); an optional `get_reward()` is one
more reward, with weight 1, named after the class. Reward functions get `environments=[env]` besides TRL's
keywords. A reply with no tool call ends the episode (it is the final answer, as in TRL's tool loop).

What differs from TRL: tool calls use esopt's ReAct formats (`tagged` by default, `<name>input</name>`, or the
`json` format `<tool_call>{...}</tool_call>`) rather than the model's own chat-template tool syntax, so any
model can call them; tool results come back as the next user message ("Observation: ..."); the episode is
scored once, at its end, on the whole conversation (the completion reward functions see is the list of
assistant and tool messages, as TRL's is with tools).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from esopt.envs.dataset import RewardFunc, check_rows, is_conversational, score_completion
from esopt.envs.tools.protocol import Tool, describe_tools
from esopt.envs.tools.react import ToolEnv

RESERVED = ("reset", "get_reward")


def environment_tools(instance: Any) -> dict[str, dict[str, Any]]:
    """{name: JSON schema of its parameters} for the environment's public methods (TRL's tool discovery)."""
    from transformers.utils import get_json_schema

    tools = {}
    for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
        if name.startswith("_") or name in RESERVED:
            continue
        try:
            schema = get_json_schema(method)["function"]
        except Exception as e:  # transformers' DocstringParsingException, TypeHintParsingException
            raise ValueError(f"environment tool {type(instance).__name__}.{name}: {e} (TRL's tools need type hints "
                             "and a Google-style docstring with an Args section)") from None
        tools[name] = {"description": schema.get("description", ""), "schema": schema.get("parameters", {})}
    if not tools:
        raise ValueError(f"{type(instance).__name__} has no public method to use as a tool")
    return tools


class EnvironmentToolEnv(ToolEnv):
    """Episodes over dataset rows (chat prompts), each with a fresh `factory()` environment whose public
    methods are the tools; scored at the end by the reward functions (and `get_reward`)."""

    plain_reply_is_answer = True
    task_intro = "Use the tools when they help."

    def __init__(self, factory: Callable[[], Any], rows: Sequence[Mapping[str, Any]],
                 reward_funcs: Sequence[RewardFunc] = (), reward_weights: Sequence[float] | None = None,
                 heldout: Sequence[Mapping[str, Any]] = (), heldout_rows: Mapping[int, int] | None = None,
                 success_threshold: float = 1.0, max_turns: int = 6, call_format: str = "tagged",
                 observation_chars: int = 800) -> None:
        check_rows(rows, "train_dataset")
        if not all(is_conversational(r["prompt"]) for r in [*rows, *heldout]):
            raise ValueError("environment_factory needs conversational prompts (lists of role/content messages), "
                             "as TRL's does")
        self.factory = factory
        self.rows, self.heldout, self.heldout_rows = rows, heldout, dict(heldout_rows or {})
        probe = factory()
        funcs = list(reward_funcs)
        weights = [1.0] * len(funcs) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(funcs):
            raise ValueError(f"{len(weights)} reward_weights for {len(funcs)} reward functions")
        if callable(getattr(probe, "get_reward", None)):
            funcs.append(self._get_reward_func(type(probe).__name__))
            weights.append(1.0)
        if not funcs:
            raise ValueError("no reward: give reward_funcs or an environment with get_reward()")
        self.reward_funcs, self.weights, self.success_threshold = funcs, weights, success_threshold
        self._specs = environment_tools(probe)
        self.instance: Any = probe
        self.row: Mapping[str, Any] = rows[0]
        self.transcript: list[dict[str, Any]] = []
        self.rewards: dict[str, float | None] = {}
        super().__init__(max_turns=max_turns, call_format=call_format, observation_chars=observation_chars)

    @staticmethod
    def _get_reward_func(name: str) -> RewardFunc:
        def env_reward(prompts, completions, environments, **kwargs):
            return [float(env.get_reward()) for env in environments]

        env_reward.__name__ = name
        return env_reward

    def _make_tools(self) -> dict[str, Tool]:
        def caller(name: str) -> Callable[..., str]:
            return lambda **arguments: str(getattr(self.instance, name)(**arguments))

        return {name: Tool(name, spec["description"], spec["schema"], caller(name))
                for name, spec in self._specs.items()}

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[str, dict]:
        observation, info = super().reset(seed=seed, options=options)
        # the whole opening: the row's messages, the tool instructions in the system message, reset's text
        # after the last user message
        messages = [dict(m) for m in self.row["prompt"]]
        tools = describe_tools(self.tools, self.call_format)
        if messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{tools}"
        else:
            messages.insert(0, {"role": "system", "content": f"{self.task_intro}\n{tools}"})
        messages[-1]["content"] = observation
        return observation, {**info, "prompt": messages}

    def _new_task(self, seed: int, options: Mapping[str, Any] | None) -> tuple[Any, str]:
        self.row = self.heldout[self.heldout_rows[seed]] if seed in self.heldout_rows else \
            self.rows[seed % len(self.rows)]
        self.instance = self.factory()
        self.transcript = []
        extra = self.instance.reset(**dict(self.row))
        question = str(self.row["prompt"][-1]["content"])
        return self.row, question + (f"\n\n{extra}" if extra else "")

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.transcript.append({"role": "assistant", "content": action if isinstance(action, str) else ""})
        observation, reward, terminated, truncated, info = super().step(action)
        if truncated and not terminated:  # out of turns: scored as it stands, as TRL scores a cut-off rollout
            self._success, self._score = self._grade("")
            reward = self._reward()
            info.update(is_success=self._success, shaped_reward=self._score)
        if terminated or truncated:
            info["rewards"] = self.rewards
        return observation, reward, terminated, truncated, info

    def _run(self, tool: Tool, arguments: dict[str, Any]) -> str:
        out = super()._run(tool, arguments)
        self.transcript.append({"role": "tool", "name": tool.name, "content": out})
        return out

    def _grade(self, answer: str) -> tuple[bool, float]:
        columns = {k: v for k, v in self.row.items() if k != "prompt"}
        score, self.rewards = score_completion(self.reward_funcs, self.weights, self.row["prompt"],
                                               list(self.transcript), {**columns, "environments": self.instance})
        return score >= self.success_threshold, score

    def _reward(self) -> float:
        return self._score if self._done else 0.0


__all__ = ["EnvironmentToolEnv", "environment_tools"]
