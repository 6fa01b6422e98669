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

from esopt.envs.dataset import RewardFunc, RowScorer, is_conversational
from esopt.envs.tools.protocol import ANSWER_TAG, TOOL_NAME, Tool, describe_tools
from esopt.envs.tools.react import ToolEnv

RESERVED = ("reset", "get_reward")


def environment_tools(cls: type) -> dict[str, dict[str, Any]]:
    """{name: (description, JSON schema of its parameters)} of the environment class's public methods, found as
    TRL finds them (functions of the class, so properties are not evaluated); refused with the reason when a
    method cannot be a tool."""
    from transformers.utils import get_json_schema

    if not callable(getattr(cls, "reset", None)):
        raise ValueError(f"{cls.__name__} has no reset(**row) method (TRL's environment contract)")
    tools = {}
    for name, function in inspect.getmembers(cls, predicate=inspect.isfunction):
        if name.startswith("_") or name in RESERVED:
            continue
        if not TOOL_NAME.fullmatch(name) or name == ANSWER_TAG:
            raise ValueError(f"environment tool {cls.__name__}.{name}: tool names are lower_snake_case and not "
                             f"{ANSWER_TAG!r} (the final answer's tag)")
        try:
            schema = get_json_schema(function)["function"]
        except Exception as e:  # transformers' DocstringParsingException, TypeHintParsingException
            raise ValueError(f"environment tool {cls.__name__}.{name}: {e} (TRL's tools need type hints and a "
                             "Google-style docstring with an Args section)") from None
        params = dict(schema.get("parameters", {}))
        params["properties"] = {k: v for k, v in params.get("properties", {}).items() if k != "self"}
        params.setdefault("required", [])  # every input has a default: none is required
        tools[name] = {"description": schema.get("description", ""), "schema": params}
    if not tools:
        raise ValueError(f"{cls.__name__} has no public method to use as a tool")
    return tools


_TOOLS: dict[type, dict[str, dict[str, Any]]] = {}


def _tools_of(cls: type) -> dict[str, dict[str, Any]]:
    """`environment_tools`, once per class (an env is made per episode; its class's schema does not change)."""
    if cls not in _TOOLS:
        _TOOLS[cls] = environment_tools(cls)
    return _TOOLS[cls]


class EnvironmentToolEnv(ToolEnv):
    """Episodes over dataset rows (chat prompts), each with a fresh `factory()` environment whose public
    methods are the tools; scored at the end by the reward functions (and `get_reward`)."""

    plain_reply_is_answer = True
    task_intro = "Use the tools when they help."
    # tools and reward functions are user code: run them one episode at a time on the rollout's thread, as TRL
    # does (shared state, signal-based timeouts), not in the engine's step threads
    concurrent_steps = False

    def __init__(self, factory: Callable[[], Any], rows: Sequence[Mapping[str, Any]],
                 reward_funcs: Sequence[RewardFunc] = (), reward_weights: Sequence[float] | None = None,
                 heldout: Sequence[Mapping[str, Any]] = (), heldout_rows: Mapping[int, int] | None = None,
                 success_threshold: float = 1.0, max_turns: int = 6, call_format: str = "tagged",
                 observation_chars: int = 800) -> None:
        if not all(is_conversational(r.get("prompt")) for r in [*rows, *heldout] if isinstance(r, Mapping)):
            raise ValueError("environment_factory needs conversational prompts (lists of role/content messages), "
                             "as TRL's does")
        self.factory = factory
        cls = factory if isinstance(factory, type) else type(factory())
        self.scorer = RowScorer(rows, reward_funcs, reward_weights, heldout, heldout_rows, success_threshold)
        if callable(getattr(cls, "get_reward", None)):
            self.scorer.reward_funcs.append(self._get_reward_func(cls.__name__))
            self.scorer.weights.append(1.0)
        if not self.scorer.reward_funcs:
            raise ValueError("no reward: give reward_funcs or an environment with get_reward()")
        self._specs = _tools_of(cls)
        self.instance: Any = None
        self.row: Mapping[str, Any] = rows[0]
        self.transcript: list[dict[str, Any]] = []
        self.rewards: dict[str, float | None] = {}
        self.question = ""
        super().__init__(max_turns=max_turns, call_format=call_format, observation_chars=observation_chars)

    @staticmethod
    def _get_reward_func(name: str) -> RewardFunc:
        def env_reward(prompts, completions, environments, **kwargs):
            return [env.get_reward() for env in environments]  # None (no score) is allowed, as in TRL

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
        messages[-1]["content"] = self.question  # as written (the observation is ASCII-only)
        return observation, {**info, "prompt": messages}

    def _new_task(self, seed: int, options: Mapping[str, Any] | None) -> tuple[Any, str]:
        self.row = self.scorer.row(seed)
        self.instance = self.factory()
        self.transcript = []
        extra = self.instance.reset(**dict(self.row))
        self.question = str(self.row["prompt"][-1]["content"]) + (f"\n\n{extra}" if extra else "")
        return self.row, self.question

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
        score, self.rewards = self.scorer.score(self.row, list(self.transcript), environments=self.instance)
        return score >= self.scorer.success_threshold, score

    def _reward(self) -> float:
        return self._score if self._done else 0.0


__all__ = ["EnvironmentToolEnv", "environment_tools"]
