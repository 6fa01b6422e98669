"""Progress bars that suit where the output goes.

On a terminal: tqdm bars. Anywhere else (a log file, `| tee`, CI): the top-level bar prints a plain line
with the rate and ETA at most every `every` seconds (and at the end), inner bars print nothing, so a log
holds readable lines instead of carriage-return control codes.
"""

from __future__ import annotations

import os
import sys
import time


def interactive() -> bool:
    return sys.stderr.isatty()


class PlainProgress:
    """tqdm's update/close interface, writing one line now and then (top-level bars only)."""

    def __init__(self, total: int | None, desc: str, leave: bool = True, initial: int = 0, every: float = 30.0,
                 unit: str = "it"):
        self.total, self.desc, self.leave, self.n, self.unit = total, desc, leave, initial, unit
        self.start_n, self.every = initial, every
        self.t0 = self.last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if self.leave and (now - self.last >= self.every or (self.total and self.n >= self.total)):
            self.last = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        elapsed, done = now - self.t0, self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else 0.0
        if not self.total:
            return f"{self.desc}: {self.n} {self.unit} | {elapsed:.0f}s"
        eta = (self.total - self.n) / rate if rate > 0 else float("nan")
        return (f"{self.desc}: {self.n}/{self.total} ({100 * self.n / self.total:.0f}%) | {elapsed:.0f}s elapsed"
                f" | ETA {fmt_seconds(eta)}")

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def fmt_seconds(s: float) -> str:
    if s != s:  # nan
        return "?"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def progress_bar(total: int | None, desc: str, leave: bool = True, initial: int = 0, unit: str = "it",
                 every: float = 30.0):
    if not interactive():
        return PlainProgress(total, desc, leave=leave, initial=initial, every=every, unit=unit)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=leave, initial=initial, unit=unit, dynamic_ncols=True)


def say(msg: str, progress: bool = True) -> None:
    """A log line that does not break a live bar."""
    if progress and interactive():
        from tqdm.auto import tqdm

        tqdm.write(msg)
    else:
        print(msg, flush=True)


def quiet_libraries() -> None:
    """No progress bars from libraries (weight loading, shard writing, GGUF conversion)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TQDM_DISABLE"] = "1"  # libraries that call tqdm directly (GGUF conversion); ours use PlainProgress
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
