"""Per-call overhead of the sandbox backends, side by side in one run, as a markdown table.

    esopt bench sandbox                 # 20 calls of each snippet per backend
    esopt bench sandbox --calls 50 --backends bwrap,process

Each call is timed from the parent (start to result, as the tool sees it). Calls of the backends are
interleaved, so load from other work on the machine falls on all of them alike. `bare` is the same
interpreter started without any sandbox (`python -I -c code`): the floor every backend pays.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from esopt.sandbox import BACKENDS, run_python
from esopt.utils.report import cpu_model

SNIPPETS = {
    "print(1)": "print(1)",
    "numeric (sum of 200k square roots)": "import math\nprint(sum(math.sqrt(i) for i in range(200_000)))",
}


def bare(code: str) -> None:
    subprocess.run([sys.executable, "-I", "-c", code], stdout=subprocess.DEVNULL, check=True, timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="esopt bench sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="calls per snippet and backend (default 20)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all)")
    parser.add_argument("--no-bare", action="store_true", help="skip the unsandboxed baseline")
    args = parser.parse_args(argv)
    names = [x for x in args.backends.split(",") if x]
    unknown = [x for x in names if x not in BACKENDS]
    if unknown or args.calls < 1:
        parser.error(f"unknown backend {unknown[0]!r}; choose from {sorted(BACKENDS)}" if unknown else "--calls >= 1")
    runners = {} if args.no_bare else {"bare": bare}
    for name in names:
        runners[name] = lambda code, name=name: run_python(code, backend=name, timeout=60, cpu_seconds=60)
    times: dict[tuple[str, str], list[float]] = {}
    for label, code in SNIPPETS.items():
        for run in runners.values():  # warm-up: the bwrap probe, page cache, imports
            run(code)
        for _ in range(args.calls):
            for name, run in runners.items():
                start = time.perf_counter()
                run(code)
                times.setdefault((label, name), []).append((time.perf_counter() - start) * 1000)
    bwrap = shutil.which("bwrap")
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip() if bwrap else "-"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; load average {load}")
    print(f"Python {sys.version.split()[0]}; {version}; {args.calls} calls per cell; "
          f"{'root' if os.geteuid() == 0 else 'non-root'} parent\n")
    print("| code | " + " | ".join(f"{name} mean / median ms" for name in runners) + " |")
    print("|---|" + "---:|" * len(runners))
    for label in SNIPPETS:
        cells = []
        for name in runners:
            t = times[(label, name)]
            cells.append(f"{statistics.mean(t):.1f} / {statistics.median(t):.1f}")
        print(f"| `{label}` | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
