"""Text spaces for language environments.

Observations use Gymnasium's own `Text` space over printable ASCII (plus newline): the env only emits
such characters, so `Text.contains` is exact for them.

Actions are whatever a model generates, so `Text.contains` (every character must be in the charset) is
too strict: `FreeText` accepts any `str` up to `max_length` characters. `sample()` still draws from the
charset (printable ASCII), which keeps `check_env` and random-agent smoke tests meaningful. Environments
must accept longer strings too (they truncate when parsing); `contains` only says what the space
promises.
"""

from __future__ import annotations

from typing import Any

from gymnasium.spaces import Text

# Printable ASCII without the rarely useful whitespace variants (\t \r \x0b \x0c), plus newline.
PRINTABLE_ASCII: str = "".join(chr(i) for i in range(32, 127)) + "\n"


def ascii_text_space(max_length: int, min_length: int = 0) -> Text:
    """A Gymnasium `Text` space of printable ASCII strings (observations)."""
    return Text(max_length=max_length, min_length=min_length, charset=PRINTABLE_ASCII)


class FreeText(Text):
    """Any Python `str` of length min_length..max_length, whatever its characters (model output).

    Sampling draws printable ASCII. Flattening (`gymnasium.spaces.flatten`) works only for strings
    inside the sampling charset, since it indexes characters; text envs never flatten actions.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=PRINTABLE_ASCII, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object, /) -> bool:
        return (
            isinstance(other, FreeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )
