"""Run model-written Python in a sandbox: one function, `run_python`, over a registry of backends.

    from esopt.sandbox import run_python
    run_python("print(6 * 7)").stdout            # "42\\n", in a fresh bubblewrap sandbox
    run_python(code, backend="process")          # the weaker fallback, by name only (warns once)

Backends (see each module's doc for what it contains and what it does not):
- `bwrap` (default, esopt.sandbox.bwrap): bubblewrap namespaces, an empty root with the Python installation
  read-only, a size-limited tmpfs, no network, a uid of its own, rlimits, seccomp. The real boundary.
- `process` (esopt.sandbox.process): a child process with rlimits, a network namespace where allowed and a
  Python audit hook. Contains accidents, not attackers; for machines where bubblewrap cannot run.

A backend that cannot run here raises `SandboxUnavailable`, whose one-line message says how to install it;
nothing falls back silently. A new backend is a module with a `run_python` of the same signature and one
line in `BACKENDS`.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from esopt.sandbox import bwrap, process
from esopt.sandbox.result import SandboxResult, SandboxUnavailable


class WeakSandboxWarning(UserWarning):
    """A sandbox that is not a security boundary was chosen."""


@dataclass(frozen=True)
class Backend:
    run: Callable[..., SandboxResult]  # run(code, *, timeout, cpu_seconds, memory_mb, max_output_bytes, ...)
    check: Callable[[], None] | None = None  # raises SandboxUnavailable where the backend cannot run
    weak: str | None = None  # set for backends that are no boundary: warned once per process when chosen


BACKENDS: dict[str, Backend] = {
    "bwrap": Backend(bwrap.run_python, bwrap.check),
    "process": Backend(process.run_python, weak="contains accidents, not attackers (no mount or pid namespace; "
                                                "an audit hook in the same interpreter)"),
}
DEFAULT_BACKEND = "bwrap"

_warned: set[str] = set()
_warn_lock = threading.Lock()


def get_backend(name: str = DEFAULT_BACKEND) -> Backend:
    """The backend called `name`, checked to run here (SandboxUnavailable if not; ValueError if unknown).
    A weak backend warns once per process (WeakSandboxWarning)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox {name!r}; choose one of {sorted(BACKENDS)}")
    chosen = BACKENDS[name]
    if chosen.check is not None:
        chosen.check()
    if chosen.weak:
        with _warn_lock:
            first = name not in _warned
            _warned.add(name)
        if first:
            warnings.warn(f"sandbox {name!r} {chosen.weak}: model-written code is not contained against an "
                          f"attacker; use the default 'bwrap' (apt-get install bubblewrap) where you can",
                          WeakSandboxWarning, stacklevel=3)
    return chosen


def check_backend(name: str = DEFAULT_BACKEND) -> None:
    """Fail early (at env construction) rather than at the first tool call."""
    get_backend(name)


def run_python(code: str, *, backend: str = DEFAULT_BACKEND, timeout: float = 5.0, cpu_seconds: int = 5,
               memory_mb: int = 512, max_output_bytes: int = 64_000, max_processes: int = 64,
               disk_mb: int = 32) -> SandboxResult:
    """Run `code` in the `backend` sandbox and return its (truncated) output. `timeout` is wall-clock
    seconds, `cpu_seconds` CPU seconds, `memory_mb` the address space, `max_output_bytes` caps the output and
    the size of any file written, `max_processes` the processes, `disk_mb` the writable tmpfs (bwrap)."""
    return get_backend(backend).run(code, timeout=timeout, cpu_seconds=cpu_seconds, memory_mb=memory_mb,
                                    max_output_bytes=max_output_bytes, max_processes=max_processes, disk_mb=disk_mb)


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "SandboxResult", "SandboxUnavailable", "WeakSandboxWarning",
           "check_backend", "get_backend", "run_python"]
