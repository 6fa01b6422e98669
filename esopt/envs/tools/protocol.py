"""The ReAct tool protocol: what a tool is, how a model calls one, and how its turn is parsed.

A turn is a thought, then exactly one of a tool call or a final answer. Two call formats are accepted:

- `tagged` (the default; for chat templates without a tool-calling convention, such as SmolLM2's): the tool's
  name as a tag around its input, and `<answer>` around the final answer::

      Thought: 7 * 13 is easy to get wrong by hand.
      <python>print(7 * 13)</python>

      <answer>91</answer>

  A tool with several inputs takes a JSON object, or its inputs in schema order separated by commas:
  `<read>{"page": 1, "start": 0, "end": 5}</read>` or `<read>1, 0, 5</read>`.
- `json`: the convention of tool-calling chat templates (Qwen, Hermes, SmolLM3):
  `<tool_call>{"name": "python", "arguments": {"code": "print(7 * 13)"}}</tool_call>`.

The parser reads both whichever format the instructions show. Model output is untrusted: `parse_turn` never
raises, and anything it cannot read comes back as `Malformed` with a reason the env shows the model. A missing
closing tag at the end of the text is accepted, because stop strings (`sampling.stop`) cut it off.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ANSWER_TAG = "answer"
CALL_FORMATS = ("tagged", "json")


@dataclass(frozen=True)
class Tool:
    """A registered tool: `run(**arguments) -> str` (the observation), checked against `schema`.

    `schema` is a JSON-schema object with `properties` (each `{"type": "string"|"integer"|"number"}`, and a
    `description`) and `required`. `time_limit` (seconds) bounds one call; the tool itself enforces it."""

    name: str
    description: str
    schema: Mapping[str, Any]
    run: Callable[..., str]
    time_limit: float = 10.0

    @property
    def parameters(self) -> list[str]:
        return list(self.schema.get("properties", {}))

    def signature(self) -> str:
        return f"{self.name}({', '.join(self.parameters)})"


_REGISTRY: dict[str, Callable[..., Tool]] = {}


def register_tool(name: str, factory: Callable[..., Tool]) -> None:
    """Register a tool factory under `name` (factories take keyword options and return a `Tool`)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"tool name {name!r} must be lower-case letters, digits and underscores")
    _REGISTRY[name] = factory


def make_tool(name: str, **options: Any) -> Tool:
    if name not in _REGISTRY:
        raise ValueError(f"unknown tool {name!r}; registered tools: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**options)


def registered_tools() -> list[str]:
    return sorted(_REGISTRY)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class Malformed:
    reason: str
    no_call: bool = False  # the reply tried no tool call and no answer at all (plain text)


def _bounded(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def coerce_arguments(tool: Tool, raw: Any) -> dict[str, Any] | Malformed:
    """Arguments for `tool` from a JSON object, or from the raw tag text (one input: the text itself; several:
    a JSON object or comma-separated values in schema order), converted to the schema's types."""
    props = dict(tool.schema.get("properties", {}))
    names = list(props)
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("{"):
            try:
                raw = json.loads(text)
            except (json.JSONDecodeError, RecursionError, ValueError):
                if len(names) != 1:
                    return Malformed(f"{tool.name}: the input is not valid JSON")
        if isinstance(raw, str):
            if len(names) == 1:
                raw = {names[0]: raw.strip("\n") if names[0] == "code" else text}
            else:
                parts = [p.strip() for p in text.split(",")] if text else []
                if len(parts) > len(names):
                    return Malformed(f"{tool.name} takes {len(names)} inputs ({', '.join(names)}), got {len(parts)}")
                raw = dict(zip(names, parts))
    if not isinstance(raw, dict):
        return Malformed(f"{tool.name}: arguments must be an object with {', '.join(names)}")
    unknown = [k for k in raw if k not in props]
    if unknown:
        return Malformed(f"{tool.name}: unknown input {_bounded(str(unknown[0]), 30)!r}; it takes {', '.join(names)}")
    out: dict[str, Any] = {}
    for name in tool.schema.get("required", names):
        if name not in raw or raw[name] in ("", None):
            return Malformed(f"{tool.name}: missing input {name!r}")
    for name, value in raw.items():
        kind = props[name].get("type", "string")
        if isinstance(kind, list):  # a nullable type, ["integer", "null"]: its non-null member
            kind = next((k for k in kind if k != "null"), "string")
        try:
            if kind == "boolean":
                text = str(value).strip().lower()
                if not isinstance(value, bool) and text not in ("true", "false"):
                    raise ValueError
                value = value if isinstance(value, bool) else text == "true"
            elif kind in ("array", "object"):
                value = json.loads(value) if isinstance(value, str) else value
                if not isinstance(value, list if kind == "array" else dict):
                    raise ValueError
            elif kind == "integer":
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                value = int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
            elif kind == "number":
                value = float(str(value).strip()) if not isinstance(value, (int, float)) else float(value)
            elif not isinstance(value, str):
                value = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        except (ValueError, OverflowError, RecursionError):
            article = "an" if kind in ("integer", "array", "object") else "a"
            return Malformed(f"{tool.name}: input {name!r} must be {article} {kind}, "
                             f"got {_bounded(str(value), 30)!r}")
        out[name] = value
    return out


TOOL_NAME = re.compile(r"[a-z][a-z0-9_]*")  # what a tagged call's tag can name
_TAG = re.compile(rf"<({TOOL_NAME.pattern})>")


def parse_turn(text: Any, tools: Mapping[str, Tool]) -> ToolCall | Answer | Malformed:
    """The turn's first tool call or final answer (whichever comes first), else `Malformed`. Never raises."""
    try:
        return _parse_turn(text, tools)
    except (ValueError, RecursionError, TypeError, OverflowError) as e:  # deep JSON, 5000-digit numbers, ...
        return Malformed(f"unreadable call ({type(e).__name__})")


def _parse_turn(text: Any, tools: Mapping[str, Tool]) -> ToolCall | Answer | Malformed:
    if not isinstance(text, str):
        return Malformed("the reply is not text")
    if len(text) > 100_000:
        text = text[:100_000]
    best: tuple[int, ToolCall | Answer | Malformed] | None = None
    json_at = text.find("<tool_call>")
    if json_at >= 0:
        best = (json_at, _parse_json_call(text[json_at + len("<tool_call>"):], tools))
    for m in _TAG.finditer(text):
        if best is not None and m.start() > best[0]:
            break
        name = m.group(1)
        if name != ANSWER_TAG and name not in tools:
            continue
        end = text.find(f"</{name}>", m.end())
        body = text[m.end(): end if end >= 0 else len(text)]
        if name == ANSWER_TAG:
            answer = body.strip()
            parsed: ToolCall | Answer | Malformed = Answer(answer) if answer else Malformed("the answer is empty")
        else:
            args = coerce_arguments(tools[name], body)
            parsed = args if isinstance(args, Malformed) else ToolCall(name, args)
        best = (m.start(), parsed)
        break
    if best is not None:
        return best[1]
    tags = ", ".join(f"<{t}>" for t in [*tools, ANSWER_TAG])
    return Malformed(f"no tool call or answer found: use one of {tags}", no_call=True)


def _parse_json_call(body: str, tools: Mapping[str, Tool]) -> ToolCall | Answer | Malformed:
    end = body.find("</tool_call>")
    body = body[: end if end >= 0 else len(body)].strip()
    try:
        call = json.loads(body)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return Malformed("<tool_call> must hold a JSON object {\"name\": ..., \"arguments\": {...}}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return Malformed("<tool_call> needs a \"name\"")
    name = call["name"]
    if name == ANSWER_TAG:
        arguments = call.get("arguments", {})
        answer = arguments.get("answer") if isinstance(arguments, dict) else arguments
        return Answer(str(answer).strip()) if answer not in (None, "") else Malformed("the answer is empty")
    if name not in tools:
        return Malformed(f"unknown tool {_bounded(name, 30)!r}; tools: {', '.join(tools)}")
    args = coerce_arguments(tools[name], call.get("arguments", {}))
    return args if isinstance(args, Malformed) else ToolCall(name, args)


def describe_tools(tools: Mapping[str, Tool], call_format: str) -> str:
    """The tool list and the call format, for the env's instructions."""
    if call_format not in CALL_FORMATS:
        raise ValueError(f"call_format must be one of {CALL_FORMATS}, got {call_format!r}")
    lines = ["Tools:"]
    for tool in tools.values():
        lines.append(f"- {tool.signature()}: {tool.description}")
    if call_format == "tagged":
        example = next(iter(tools.values()))
        lines += ["Each reply: one short thought, then either one tool call or the final answer.",
                  f"Call a tool by wrapping its input in its tag, e.g. <{example.name}>...</{example.name}>; "
                  "several inputs as a JSON object.",
                  "Give the final answer as <answer>...</answer>."]
    else:
        lines += ["Each reply: one short thought, then either one tool call or the final answer.",
                  'Call a tool as <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>.',
                  'Give the final answer as <tool_call>{"name": "answer", "arguments": {"answer": "..."}}</tool_call>.']
    return "\n".join(lines)


def stop_strings(tools: Mapping[str, Tool]) -> list[str]:
    """Stop strings that end a turn right after its call or answer (put them in `sampling.stop`)."""
    return [f"</{name}>" for name in [*tools, ANSWER_TAG]] + ["</tool_call>"]
