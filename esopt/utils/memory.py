"""Peak memory: peak RSS of this process on CPU, torch.cuda.max_memory_allocated on CUDA."""

from __future__ import annotations

import math
import os
import resource
import sys

import torch

# glibc raises its mmap threshold (up to 32 MB) each time a large block is freed, so which tensors land in the
# heap, and how much freed heap RSS keeps, depends on the order of earlier frees: the peak RSS of the same run
# varied by +-120 MiB. A fixed threshold maps every block over 64 KiB on its own and unmaps it when freed, so
# the peak tracks live memory (two repeats of each side of the efficiency bench agreed within 10 MiB).
# glibc reads these at start-up: they are for fresh processes that measure a peak.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def steady_malloc_active() -> bool:
    """Whether this process started with `STEADY_MALLOC` (glibc reads it only at start-up)."""
    return all(os.environ.get(k) == v for k, v in STEADY_MALLOC.items())


def steady_malloc_env() -> dict[str, str]:
    """This process's environment with `STEADY_MALLOC`: for a child process that measures a peak."""
    return {**os.environ, **STEADY_MALLOC}


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


def fmt_mib(n: float | None) -> str:
    """Whole MiB ("n/a" when unmeasured): peak ratios compare peaks a few percent apart, which GiB hides."""
    return "n/a" if n is None or math.isnan(n) else f"{n / 2**20:.0f} MiB"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"
