"""Kill a child process at a named pause point (`esopt.utils.faults`), for resume tests."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path


def kill_when_parked(proc: subprocess.Popen, point: str, pause_dir: Path, timeout: float = 300) -> dict:
    """Once `proc` reports it waits at `point` (NAME or NAME@N), SIGKILL it; returns what the point reported."""
    reached = pause_dir / f"{point.split('@')[0]}.reached"
    deadline = time.time() + timeout
    while not reached.exists():  # a file handshake: the run is parked at the point once this exists
        assert proc.poll() is None, f"the run ended before reaching {point}: {proc.stderr.read()[-2000:]}"
        assert time.time() < deadline, f"{point} not reached in {timeout:.0f} s"
        time.sleep(0.02)
    info = json.loads(reached.read_text())
    assert info["pid"] == proc.pid
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    return info
