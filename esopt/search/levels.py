"""Representation levels: what the model writes, the EoH operator prompts for it, and how its text becomes a
heuristic. A 135M model writes little valid code, so the levels trade expressiveness for validity:

- L0: the numbers of a fixed parametrised template (`Problem.template`), e.g. "p=1.2 a=0.5 t=8";
- L1: one numpy expression over fixed variables (`Problem.expression`), edited from a parent;
- L2: a whole function (for larger models).

Every level ends in the full source of the problem's function, which then goes through the same allowlist
and sandbox. The assistant's answer is started for the model (`prefill`: "p=", "score = ", "def ..."), so
it continues in the expected form instead of opening with prose.

EoH operators: i1 (new), e1 (different from two parents), e2 (combining two parents), m1 (modify a
parent), m2 (tune a parent's parameters).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from esopt.envs.heuristics import Problem, UnsafeCode, check_expression

OPERATORS = ("i1", "e1", "e2", "m1", "m2")
PARENTS = {"i1": 0, "e1": 2, "e2": 2, "m1": 1, "m2": 1}
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
MAX_PARAMETER = 1e6  # |value| above this reads as noise, not a parameter


@dataclass(frozen=True)
class Parent:
    text: str  # what the level shows the model
    objective: float


@dataclass(frozen=True)
class Parsed:
    text: str  # the canonical text of the proposal (shown when it is a parent later)
    code: str  # the whole function


_ASK = {
    "L0": {"i1": "Write new numbers.", "e1": "Write numbers different from both parents.",
           "e2": "Write numbers that combine both parents.", "m1": "Write modified numbers.",
           "m2": "Change the numbers slightly."},
    "L1": {"i1": "Write a new expression.", "e1": "Write a new expression different from both.",
           "e2": "Write an expression that combines both.", "m1": "Write a modified expression.",
           "m2": "Change the constants of the expression."},
    "L2": {"i1": "Write a new heuristic.", "e1": "Write a new heuristic different from both.",
           "e2": "Write a heuristic that combines the ideas of both.", "m1": "Write a modified heuristic.",
           "m2": "Change the parameters of the heuristic."},
}


def prompt(level: str, problem: Problem, operator: str, parents: list[Parent]) -> tuple[list[dict], str]:
    """(chat messages, prefill) for one proposal; the prefill is appended to the rendered prompt."""
    if level not in _ASK:
        raise ValueError(f"unknown level {level!r}; choose L0, L1 or L2")
    if operator not in PARENTS:
        raise ValueError(f"unknown operator {operator!r}; choose one of {OPERATORS}")
    if len(parents) != PARENTS[operator]:
        raise ValueError(f"operator {operator} takes {PARENTS[operator]} parents, got {len(parents)}")
    if level == "L0":
        t = problem.template
        form = " ".join(f"{n}={v:g}" for n, v in zip(t.names, t.seeds[0]))  # an example: the seed's values
        system = f"{problem.description} The heuristic: {t.formula}. Reply with the numbers only, as: {form}"
        shown, prefill = [p.text for p in parents], f"{t.names[0]}="
    elif level == "L1":
        e = problem.expression
        system = (f"{problem.description} A heuristic is one numpy expression (np is numpy); the {e.goal} score "
                  f"wins. Variables: {e.variables}. Reply with the expression only.")
        shown, prefill = [f"score = {p.text}" for p in parents], "score = "
    else:
        signature = f"def {problem.function}({', '.join(problem.arguments)}):"
        system = f"{problem.description} Write `{signature}` in Python with numpy (np) and math only, no imports."
        shown, prefill = [f"```python\n{p.text}```" for p in parents], f"```python\n{signature}\n"
    lines = []
    for i, (p, s) in enumerate(zip(parents, shown)):
        label = "Parent" if len(parents) == 1 else f"Parent {i + 1}"
        lines.append(f"{label}: {s} (cost {p.objective:.3f}, lower is better)")
    user = "\n".join([*lines, _ASK[level][operator]])
    return [{"role": "system", "content": system}, {"role": "user", "content": user}], prefill


def parse(level: str, problem: Problem, completion: str) -> Parsed:
    """The heuristic in a completion (the text after the prefill); UnsafeCode/ValueError with a one-line
    reason if there is none."""
    if level == "L0":
        t = problem.template
        line = (t.names[0] + "=" + completion.strip()).splitlines()[0][:300]
        named = [re.search(rf"\b{n}\s*=\s*({_NUMBER.pattern})", line) for n in t.names]
        if all(named):  # "p=1.2 a=0.5 t=8", in any order
            values = [float(m.group(1)) for m in named if m]
        else:  # "1.2 0.5 8": the first numbers of the line, in order
            values = [float(x) for x in _NUMBER.findall(line)[:len(t.names)]]
        if len(values) < len(t.names):
            raise ValueError(f"expected {len(t.names)} numbers on the first line, found {len(values)}")
        if not all(math.isfinite(v) and abs(v) <= MAX_PARAMETER for v in values):
            raise ValueError(f"a number is not finite or above {MAX_PARAMETER:g} in magnitude")
        text = " ".join(f"{n}={v:g}" for n, v in zip(t.names, values))
        return Parsed(text, t.render(tuple(values)))
    if level == "L1":
        line = completion.strip().splitlines()[0] if completion.strip() else ""
        expr = line.strip().rstrip(";").strip().strip("`").rstrip(";").strip()  # `expr`; or expr;
        check_expression(expr)
        return Parsed(expr, problem.expression.render(expr))
    if level == "L2":
        signature = f"def {problem.function}({', '.join(problem.arguments)}):"
        body = []
        for line in completion.split("```")[0].splitlines():
            if line.strip() and not line[:1].isspace():
                break  # the function ended
            body.append(line)
        code = signature + "\n" + "\n".join(body).rstrip() + "\n"
        if not any(x.strip() for x in body):
            raise UnsafeCode("empty function body")
        return Parsed(code, code)
    raise ValueError(f"unknown level {level!r}; choose L0, L1 or L2")


def seeds(level: str, problem: Problem) -> list[tuple[str, Parsed]]:
    """(name, heuristic) of the baselines the level can express: the search's initial population."""
    if level == "L0":
        t = problem.template
        return [(f"template {i}", Parsed(" ".join(f"{n}={v:g}" for n, v in zip(t.names, s)), t.render(s)))
                for i, s in enumerate(t.seeds)]
    if level == "L1":
        return [(f"expression {e}", Parsed(e, problem.expression.render(e))) for e in problem.expression.seeds]
    if level == "L2":
        return [(name, Parsed(code, code)) for name, code in problem.baselines.items()]
    raise ValueError(f"unknown level {level!r}; choose L0, L1 or L2")
