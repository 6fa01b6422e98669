"""`esopt/MathTool-v0`: math questions answered by a ReAct agent with a sandboxed Python tool.

Tasks come from `reasoning-gym`'s procedural generators (deterministic by seed; `tasks` names them, and
`task_config` passes each generator its options), or from a user JSONL file with `question` and `answer` per
line (`data_file`, e.g. DAPO or AIME: the task for seed s is line s mod N). The reward is 1 if the final answer
equals the gold answer (`esopt.envs.tools.answers.math_equal`: numbers, fractions and simple expressions),
else 0.

The Python tool runs each call in a fresh sandbox (`esopt.sandbox`): `sandbox` names the backend, "bwrap"
(the default: bubblewrap namespaces, the real boundary; needs `apt-get install bubblewrap`, and the env
refuses to start without it) or "process" (a contained child process: accidents, not attackers; chosen by
name only, and warned about once).

    env = gymnasium.make("esopt/MathTool-v0", tasks=["basic_arithmetic"], max_turns=4)
    env = gymnasium.make("esopt/MathTool-v0", sandbox="process")  # where bubblewrap cannot run
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esopt.envs.tools import make_tool
from esopt.envs.tools.answers import math_equal, normalize_math, to_number
from esopt.envs.tools.protocol import Tool
from esopt.envs.tools.react import ToolEnv

DEFAULT_TASKS = ("basic_arithmetic",)
# Worked exchanges for few-shot prompts: (question, code, what it prints, answer); they show the protocol.
DEMOS = (("What is 17 * 24 - 5?", "print(17 * 24 - 5)", "403", "403"),
         ("Solve for x: 3*x + 7 = 25", "print((25 - 7) / 3)", "6.0", "6"),
         ("Simplify the fraction 84/126 to its lowest terms.",
          "from fractions import Fraction\nprint(Fraction(84, 126))", "2/3", "2/3"))


def load_math_jsonl(path: str | Path) -> list[dict[str, str]]:
    """Rows with `question` and `answer` (both required; answers are compared as math, so numbers may be
    JSON numbers). A bad line is a ValueError naming the file and line."""
    rows = []
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data_file {str(path)!r} does not exist")
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ValueError(f"{path}:{n}: each line needs \"question\" and \"answer\"")
        rows.append({"question": str(row["question"]), "answer": str(row["answer"])})
    if not rows:
        raise ValueError(f"data_file {str(path)!r} has no rows")
    return rows


class MathToolEnv(ToolEnv):
    task_intro = ("Answer the math question. You can run Python to compute: it prints what you print(). "
                  "Give the final answer as a number or fraction.")

    def __init__(self, tasks: Sequence[str] = DEFAULT_TASKS, task_config: Mapping[str, Mapping[str, Any]] | None = None,
                 data_file: str | None = None, max_turns: int = 4, call_format: str = "tagged",
                 observation_chars: int = 400, python_timeout: float = 5.0, render_mode: str | None = None,
                 sandbox: str = "bwrap") -> None:
        if isinstance(tasks, str):
            tasks = [tasks]
        self.task_names = list(tasks)
        self.task_config = {k: dict(v) for k, v in (task_config or {}).items()}
        self.python_timeout = float(python_timeout)
        self.sandbox = str(sandbox)
        self.rows = load_math_jsonl(data_file) if data_file else None
        if self.rows is None:
            import reasoning_gym

            known = set(reasoning_gym.factory.DATASETS)
            unknown = [t for t in [*self.task_names, *self.task_config] if t not in known]
            if not self.task_names or unknown:
                raise ValueError(f"unknown reasoning-gym task {unknown[0] if unknown else None!r}; "
                                 f"e.g. basic_arithmetic, simple_equations, gsm_symbolic, fraction_simplification")
        super().__init__(max_turns=max_turns, call_format=call_format, observation_chars=observation_chars,
                         render_mode=render_mode)

    def _make_tools(self) -> dict[str, Tool]:
        return {"python": make_tool("python", timeout=self.python_timeout, cpu_seconds=max(1, int(self.python_timeout)),
                                    sandbox=self.sandbox)}

    def _new_task(self, seed: int, options: Mapping[str, Any] | None) -> tuple[dict[str, str], str]:
        if options and "question" in options:
            task = {"question": str(options["question"]), "answer": str(options["answer"])}
        elif self.rows is not None:
            task = self.rows[seed % len(self.rows)]
        else:
            import reasoning_gym

            name = self.task_names[int(np.random.default_rng([seed, 7]).integers(len(self.task_names)))]
            entry = reasoning_gym.create_dataset(name, size=1, seed=seed, **self.task_config.get(name, {}))[0]
            task = {"question": str(entry["question"]), "answer": str(entry["answer"]), "task": name}
        return task, f"Question: {task['question']}"

    def _grade(self, answer: str) -> tuple[bool, float]:
        correct = math_equal(answer, self._task["answer"])
        return correct, float(correct)

    def _answer_key(self, answer: str) -> str:
        value = to_number(answer)
        try:
            return str(value) if value is not None else normalize_math(answer)
        except ValueError:  # an integer too long to print
            return normalize_math(answer)

    def worked_examples(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        """Demo exchanges: a question answered with one Python call, then the answer after the observation.
        Two exchanges per demo question (the call, then the answer)."""
        pairs: list[tuple[str, str]] = []
        for question, code, printed, answer in DEMOS:
            if len(pairs) >= count:
                break
            call = self._format_call("python", code)
            pairs.append((f"Question: {question}", f"Thought: I will compute it with Python.\n{call}"))
            if len(pairs) < count:
                pairs.append((f"Observation: {printed}",
                              f"Thought: that is the result.\n{self._format_call('answer', answer)}"))
        return pairs[:count]

    def _format_call(self, name: str, value: str) -> str:
        if self.call_format == "tagged":
            return f"<{name}>{value}</{name}>"
        args = {"answer": value} if name == "answer" else {"code": value}
        return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"

