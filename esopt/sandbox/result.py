"""What every sandbox backend returns (`SandboxResult`), and the error of a backend that cannot run here."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field


class SandboxUnavailable(RuntimeError):
    """The chosen sandbox cannot run on this machine (the message says how to fix it, on one line)."""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    seconds: float = 0.0
    layers: list[str] = field(default_factory=list)
    output_full: bool = False

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    def observation(self, max_chars: int) -> str:
        """What the model sees: output, the error's last lines, and why the run stopped if it was stopped."""
        parts = []
        if self.stdout.strip():
            parts.append(self.stdout.rstrip())
        if self.returncode != 0 and self.stderr.strip():
            lines = [x for x in self.stderr.strip().splitlines() if 'File "<string>"' not in x]  # not the bootstrap
            tail = lines[-3:]
            parts.append("\n".join(tail))
        if self.timed_out:
            parts.append("(stopped: wall-clock time limit)")
        elif self.signal_name == "SIGXCPU" or self.signal_name == "SIGKILL":
            parts.append("(stopped: CPU time limit)")
        elif self.signal_name == "SIGXFSZ" or self.output_full:
            parts.append("(stopped: output limit)")
        elif self.signal_name:
            parts.append(f"(stopped: {self.signal_name})")
        text = "\n".join(parts) if parts else "(no output; print() what you need)"
        suffix = "\n...(truncated)"
        return text if len(text) <= max_chars else text[: max_chars - len(suffix)] + suffix


def read_limited(path: str, limit: int) -> str:
    """The first `limit` bytes of a file as text ('' if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def wait_then_kill_group(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to `timeout` s, then kill the child's whole process group (stragglers included) either way and
    reap the child; True if the wall clock ran out."""
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    return timed_out
