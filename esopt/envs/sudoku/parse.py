"""The move parser: the first `set r c v` (or `r2c3=5`, `2 3 5`, JSON) in free model text. Never raises."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

# Only this many leading characters of an action are parsed (64 new tokens of a BPE model is ~250 chars).
MAX_PARSE_CHARS = 256
USAGE = "set r c v"

_N = r"([0-9]+)"
_SET_RE = re.compile(rf"\bset\b\s*[:(\[]?\s*{_N}\s*[,\s]\s*{_N}\s*[,\s=]\s*{_N}", re.I | re.A)
_RC_RE = re.compile(
    rf"(?<![a-z])r(?:ow)?\s*{_N}\s*,?\s*c(?:ol(?:umn)?)?\s*{_N}\s*(?:=|:|,|\s|\bto\b)\s*(?:v(?:alue)?\s*=?\s*)?{_N}",
    re.I | re.A,
)
_BARE_RE = re.compile(rf"^[ \t(\[]*{_N}[ \t]*[, \t][ \t]*{_N}[ \t]*[, \t][ \t]*{_N}[ \t)\].]*$", re.M | re.A)
_JSON_RE = re.compile(r"\{[^{}]*\}")
_JSON_KEYS = {
    "row": ("row", "r"),
    "col": ("col", "c", "column"),
    "value": ("value", "v", "val", "digit", "number", "num"),
}
_PARSE_ERROR = ("bad format", f"invalid: could not parse; use: {USAGE}")


class _Err(tuple):
    """(short, long) feedback for a move that was not understood or is out of range."""


def _range_check(nums: Sequence[int], size: int) -> tuple[int, int, int] | _Err:
    for name, v in zip(("row", "column", "value"), nums):
        if not 1 <= v <= size:
            shown = str(v) if v < 1000 else ">999"
            return _Err((f"bad {name[:3]} {shown}", f"invalid: {name} {shown} out of range 1..{size}"))
    return int(nums[0]), int(nums[1]), int(nums[2])


def _json_nums(blob: str) -> list[int] | None:
    for text in (blob, blob.replace("'", '"')):
        try:
            obj = json.loads(text)
            break
        except ValueError:
            continue
    else:
        return None
    if not isinstance(obj, dict):
        return None
    lower = {str(k).strip().lower(): v for k, v in obj.items()}
    nums = []
    for aliases in _JSON_KEYS.values():
        v = next((lower[a] for a in aliases if a in lower), None)
        if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():
            v = int(v.strip())
        if isinstance(v, bool) or not isinstance(v, int):
            return None
        nums.append(v)
    return nums


def _parse(text: Any, size: int) -> tuple[int, int, int] | _Err:
    if text is None:
        return _Err(("empty", f"invalid: empty action; use: {USAGE}"))
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text[: 4 * MAX_PARSE_CHARS]).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        text = str(text)
    text = text[:MAX_PARSE_CHARS]
    if not text.strip():
        return _Err(("empty", f"invalid: empty action; use: {USAGE}"))
    found: list[tuple[int, tuple[int, int, int] | _Err]] = []
    for pattern in (_SET_RE, _RC_RE, _BARE_RE):
        for m in pattern.finditer(text):
            found.append((m.start(), _range_check([int(g) for g in m.groups()], size)))
    for m in _JSON_RE.finditer(text):
        nums = _json_nums(m.group(0))
        if nums is not None:
            found.append((m.start(), _range_check(nums, size)))
    found.sort(key=lambda item: (item[0], isinstance(item[1], _Err)))
    for _, result in found:
        if not isinstance(result, _Err):
            return result
    return found[0][1] if found else _Err(_PARSE_ERROR)


def parse_action(text: Any, size: int) -> tuple[int, int, int] | str:
    """Parse one move into 1-indexed (row, col, value), or return an error message. Never raises.

    Accepts `set r c v` (also `set r,c,v`, any case), `r2c3=5`, `r2 c3 5`, `2 3 5` (alone on a line) and
    JSON `{"row":2,"col":3,"value":5}` (or keys r/c/v). Only the first MAX_PARSE_CHARS characters are
    read; the earliest valid move wins, else the earliest out-of-range error, else a usage message.
    """
    try:
        result = _parse(text, size)
    except Exception:  # defensive: the parser must never take a rollout down
        return _PARSE_ERROR[1]
    return result[1] if isinstance(result, _Err) else result


def _parse_safe(action: Any, size: int) -> tuple[int, int, int] | _Err:
    try:
        return _parse(action, size)
    except Exception:
        return _Err(_PARSE_ERROR)
