"""What every analysis and benchmark report shares: common options, the .md/.json pair, change formatting."""

import argparse
import platform
import subprocess


def add_analysis_options(p: argparse.ArgumentParser, writes: str) -> None:
    """The options every analysis shares: smoke preset, threads, output folder, quiet."""
    p.add_argument("--smoke", action="store_true", help="a seconds-long preset (tests)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: no OpenMP oversubscription)")
    p.add_argument("--out", default="results", help=f"writes {writes}")
    p.add_argument("--quiet", action="store_true")


def write_report(out: str, name: str, text: str, data: dict) -> None:
    """OUT/NAME.md (the table, also printed) and OUT/NAME.json (everything measured)."""
    import json
    from pathlib import Path

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(text)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    print(text)
    print(f"wrote {folder / f'{name}.md'} and {folder / f'{name}.json'}")


def fmt_change(change) -> str:
    """A (mean, low, high) change as '+0.012 [-0.003, +0.027]'."""
    return f"{change[0]:+.3f} [{change[1]:+.3f}, {change[2]:+.3f}]"


def cpu_model() -> str:
    """The CPU's model name (`lscpu`, else /proc/cpuinfo), to print next to any timing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
