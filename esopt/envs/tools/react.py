"""`ToolEnv`: the base of ReAct envs. Each turn the model writes a thought and one tool call or its final
answer (`esopt.envs.tools.protocol`); the env runs the tool and shows its output as the next observation.

Budgets: `max_turns` replies per episode (then truncated, reward 0), a time limit per tool call (the tool's
own), and `observation_chars` per observation. Generated tokens per episode are capped by the rollout engine
(`env.max_episode_tokens`). A malformed call costs a turn and gets feedback naming what was wrong; a tool
that fails returns its error as the observation. Nothing the model writes raises.

Subclasses give the task (`_new_task`), the tools (`_make_tools`) and the grader (`_grade`). The rollout
engine steps envs with `concurrent_steps = True` in threads, so one slow tool does not stall the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from esopt.envs.base import AgentEnv
from esopt.envs.text_space import PRINTABLE_ASCII, FreeText, ascii_text_space
from esopt.envs.tools.protocol import (
    CALL_FORMATS,
    Answer,
    Malformed,
    Tool,
    ToolCall,
    describe_tools,
    parse_turn,
    stop_strings,
)

MAX_ACTION_CHARS = 20_000
_PRINTABLE = set(PRINTABLE_ASCII)


def printable(text: str) -> str:
    """Observations are printable ASCII (the observation space): other characters become '?'."""
    return "".join(c if c in _PRINTABLE else ("\n" if c in "\r\t" else "?") for c in text)


class ToolEnv(AgentEnv):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    concurrent_steps = True
    task_intro = "Solve the task with the tools."
    # TRL's convention: a reply with no tool call is the final answer (else it is malformed and costs a turn)
    plain_reply_is_answer = False

    def __init__(self, max_turns: int = 6, call_format: str = "tagged", observation_chars: int = 800,
                 render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self._last_observation = ""
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if call_format not in CALL_FORMATS:
            raise ValueError(f"call_format must be one of {list(CALL_FORMATS)}, got {call_format!r}")
        if isinstance(observation_chars, bool) or not isinstance(observation_chars, int) or observation_chars < 40:
            raise ValueError(f"observation_chars must be an integer >= 40, got {observation_chars!r}")
        self.max_turns, self.call_format, self.observation_chars = max_turns, call_format, observation_chars
        self.action_space = FreeText(MAX_ACTION_CHARS)
        self.observation_space = ascii_text_space(max(observation_chars, 4000) + 200)
        self.tools: dict[str, Tool] = self._make_tools()
        self.instructions = f"{self.task_intro}\n{describe_tools(self.tools, call_format)}"
        self.stop_strings = stop_strings(self.tools)
        self._turn = 0
        self._done = True
        self._task: Any = None
        self._success = False
        self._score = 0.0
        self.tool_calls = 0

    # -- for subclasses
    def _make_tools(self) -> dict[str, Tool]:
        raise NotImplementedError

    def _new_task(self, seed: int, options: Mapping[str, Any] | None) -> tuple[Any, str]:
        """(task, question shown to the model) for this seed."""
        raise NotImplementedError

    def _grade(self, answer: str) -> tuple[bool, float]:
        """(exactly right, shaped score in [0, 1]) of a final answer to the current task."""
        raise NotImplementedError

    def _reward(self) -> float:
        """The step's reward: 1 once the episode is solved (subclasses may pay the graded score instead)."""
        return 1.0 if self._success else 0.0

    def _answer_key(self, answer: str) -> str:
        """The answer in a canonical form, so that equal answers vote together."""
        return " ".join(answer.split()).lower()

    # -- gymnasium API
    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        task_seed = int(self.np_random.integers(2**31)) if seed is None else int(seed)
        self._task, question = self._new_task(task_seed, options)
        self._turn, self._done, self._success, self._score, self.tool_calls = 0, False, False, 0.0, 0
        return self._observation(question), {"is_success": False, "action_is_valid": True, "feedback": ""}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        self._turn += 1
        parsed = parse_turn(action, self.tools)
        if isinstance(parsed, Malformed) and parsed.no_call and self.plain_reply_is_answer:
            parsed = Answer(action.strip() if isinstance(action, str) else "")
        terminated, valid, tool = False, True, ""
        if isinstance(parsed, Answer):
            self._success, self._score = self._grade(parsed.text)
            terminated = True
            observation = "Answer recorded."
        elif isinstance(parsed, ToolCall):
            tool = parsed.name
            self.tool_calls += 1
            observation = "Observation: " + self._run(self.tools[parsed.name], parsed.arguments)
        else:
            valid = False
            observation = f"Observation: invalid reply: {parsed.reason}"
        truncated = not terminated and self._turn >= self.max_turns
        if truncated:
            observation += "\nOut of turns."
        self._done = terminated or truncated
        reward = self._reward()
        info = {"is_success": self._success, "action_is_valid": valid, "shaped_reward": float(self._score),
                "feedback": observation[:200], "tool": tool, "tool_calls": self.tool_calls}
        if terminated:
            info["action_is_correct"] = self._success
            info["answer"] = self._answer_key(parsed.text)  # what majority voting compares
        return self._observation(observation), reward, terminated, truncated, info

    def _run(self, tool: Tool, arguments: dict[str, Any]) -> str:
        try:
            out = tool.run(**arguments)
        except Exception as e:  # a tool's failure is the model's observation, never the host's crash
            out = f"{tool.name} failed: {type(e).__name__}: {e}"
        out = str(out)
        limit = self.observation_chars
        return out if len(out) <= limit else out[: limit - 15] + "\n...(truncated)"

    def _observation(self, text: str) -> str:
        # no running turn count: small models copy it into their answers; only the last turn is announced
        last = self.max_turns - self._turn == 1 and not self._done
        self._last_observation = printable(f"{text}\n(last turn: give your answer)" if last else text)
        return self._last_observation

    def render(self) -> str | None:
        return self._last_observation if self.render_mode == "ansi" else None
