"""BrowserGym's action calls, read from untrusted model text with `ast` (never `eval`).

A reply may hold thoughts around the call; `parse_action` takes the first call of a known action whose arguments
are all literals (`click("12")`, `fill('14', "blue mug")`, `select_option("7", ["Express"])`, `scroll(0, 300)`,
`send_msg_to_user("42")`), inside a ``` fence or not. Anything else is a `ParseError` with a one-line reason that
the env shows the model. Nothing the model writes raises past this module.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

MAX_ACTION_CHARS = 4000  # the part of a reply that is searched (bounded work per turn)
MAX_STARTS, MAX_ENDS = 16, 24  # call starts tried, and closing parentheses tried per start
# name -> (parameter names, how many are required); types are checked in `_check`
ACTIONS: dict[str, tuple[tuple[str, ...], int]] = {
    "click": (("bid", "button", "modifiers"), 1),
    "dblclick": (("bid", "button", "modifiers"), 1),
    "fill": (("bid", "value"), 2),
    "clear": (("bid",), 1),
    "select_option": (("bid", "options"), 2),
    "check": (("bid",), 1),
    "uncheck": (("bid",), 1),
    "press": (("bid", "key_comb"), 2),
    "focus": (("bid",), 1),
    "hover": (("bid",), 1),
    "scroll": (("delta_x", "delta_y"), 2),
    "go_back": ((), 0),
    "go_forward": ((), 0),
    "goto": (("url",), 1),
    "send_msg_to_user": (("text",), 1),
    "report_infeasible": (("reason",), 1),
    "noop": (("wait_ms",), 0),
}
ACTION_HELP = (
    'click("bid"), fill("bid", "text"), select_option("bid", "option"), check("bid"), uncheck("bid"), '
    'press("bid", "Enter"), scroll(0, 300) / scroll(0, -300), go_back(), go_forward(), goto("url"), '
    'send_msg_to_user("answer"), noop()'
)
_CALL_START = re.compile(r"\b(" + "|".join(sorted(ACTIONS, key=len, reverse=True)) + r")\s*\(")


@dataclass(frozen=True)
class Action:
    name: str
    args: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(repr(v) for v in self.args.values())})"


@dataclass(frozen=True)
class ParseError:
    reason: str


def parse_action(text: Any) -> Action | ParseError:
    """The first well-formed action call in `text`, or why there is none."""
    if not isinstance(text, str):
        return ParseError("the reply is not text")
    text = text[:MAX_ACTION_CHARS]
    fenced = re.findall(r"```(?:python|py)?\s*\n?(.*?)```", text, flags=re.S)
    first_error: ParseError | None = None
    for source in [*fenced, text]:
        for match in list(_CALL_START.finditer(source))[:MAX_STARTS]:
            got = _parse_at(source, match.start())
            if isinstance(got, Action):
                return got
            first_error = first_error or got
    if first_error is not None:
        return first_error
    unknown = re.search(r"\b([A-Za-z_]\w*)\s*\(", text)
    if unknown:
        return ParseError(f"unknown action {unknown.group(1)[:30]!r}; use one of: {ACTION_HELP}")
    return ParseError(f"no action found; reply with one call such as {ACTION_HELP}")


def _parse_at(source: str, start: int) -> Action | ParseError:
    """The call starting at `start`: tries each ')' after it as the end, the shortest that parses wins."""
    error: ParseError | None = None
    for close in [m.start() for m in re.finditer(r"\)", source[start:])][:MAX_ENDS]:
        snippet = source[start : start + close + 1]
        try:
            tree = ast.parse(snippet.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        call = tree.body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        got = _from_call(call)
        if isinstance(got, Action):
            return got
        error = error or got
    return error or ParseError("the action call is not closed or not valid Python syntax")


def _literal(node: ast.AST) -> Any:
    return ast.literal_eval(node)


def _from_call(call: ast.Call) -> Action | ParseError:
    name = call.func.id  # type: ignore[attr-defined]
    params, required = ACTIONS[name]
    try:
        values = [_literal(a) for a in call.args]
        keywords = {k.arg: _literal(k.value) for k in call.keywords if k.arg is not None}
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return ParseError(f'{name}: arguments must be plain literals such as "12" or 300')
    if len(values) > len(params) or any(k not in params for k in keywords) or len(call.keywords) != len(keywords):
        return ParseError(
            f"{name} takes ({', '.join(params)}), got {len(values)} positional and {sorted(keywords)[:3]} "
            "keyword arguments"
        )
    args = dict(zip(params, values))
    for k, v in keywords.items():
        if k in args:
            return ParseError(f"{name}: {k} given twice")
        args[k] = v
    missing = [p for p in params[:required] if p not in args]
    if missing:
        return ParseError(f"{name} needs {', '.join(missing)}: e.g. {_example(name)}")
    return _check(name, args)


def _example(name: str) -> str:
    found = re.search(rf"\b{name}\([^)]*\)", ACTION_HELP)
    return found.group(0) if found else f"{name}(...)"


def _check(name: str, args: dict[str, Any]) -> Action | ParseError:
    if "bid" in args:
        bid = args["bid"]
        if isinstance(bid, bool) or not isinstance(bid, (str, int)) or not str(bid).strip():
            return ParseError(f'{name}: bid must be an element id such as "12"')
        args["bid"] = str(bid).strip()[:20]
    for key in ("value", "text", "reason", "url", "key_comb"):
        if key not in args:
            continue
        if isinstance(args[key], bool) or not isinstance(args[key], (str, int, float)):
            return ParseError(f"{name}: {key} must be a string")
        args[key] = str(args[key])
    if name == "select_option":
        options = args["options"]
        options = [options] if isinstance(options, (str, int, float)) and not isinstance(options, bool) else options
        if (
            not isinstance(options, (list, tuple))
            or not options
            or not all(isinstance(o, (str, int, float)) for o in options)
        ):
            return ParseError("select_option: options must be a string or a list of strings")
        args["options"] = [str(o) for o in options][:20]
    if name == "scroll":
        for key in ("delta_x", "delta_y"):
            value = args[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                return ParseError(f"scroll: {key} must be a number")
    return Action(name, args)
