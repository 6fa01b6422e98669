"""Peak memory: peak RSS of this process on CPU, torch.cuda.max_memory_allocated on CUDA."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_bytes(device: str | torch.device = "cpu") -> int:
    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # Linux: VmHWM is this process's own peak. ru_maxrss is not: a child inherits its parent's
    # value across fork+exec, so a probe process would report the trainer's peak.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"
