"""python -m tests.mutation [--only MODULE ...] [--jobs N] [--timeout S] [--list]

For every sabotage in `sabotages.py`: apply it to a temporary copy of the repository, run its tests there
(`pytest -x`), undo it. Killed: a test failed (or the run timed out). Survived: every test passed.
Prints killed/total per module and every survivor; exits 1 if any sabotage survived or no longer applies."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.mutation.sabotages import SABOTAGES, Sabotage

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("esopt", "tests", "configs", "pyproject.toml")


def make_copy(into: Path, tests_from: Path | None = None) -> Path:
    """esopt/, tests/ (or `tests_from`), configs/ and pyproject.toml copied into `into`."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for name in COPIED:
        src = (tests_from if name == "tests" and tests_from else ROOT / name)
        if src.is_dir():
            shutil.copytree(src, into / name, ignore=ignore, symlinks=True)
        elif src.exists():
            shutil.copy2(src, into / name)
    return into


def environment(copy: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "HYPOTHESIS_PROFILE": "ci",
            # the warm-started tiny model is cached once for the checkout; the copy reads the same cache
            "ESOPT_CACHE": os.environ.get("ESOPT_CACHE", str(ROOT / ".cache" / "esopt"))}


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout' | 'error', seconds, output tail) of `pytest -x TESTS` in the copy."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-p", "no:xdist", "--no-header", "-W", "ignore", *tests]
    t = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=copy, env=environment(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t, ""
    outcome = {0: "passed", 1: "failed"}.get(res.returncode, "error")
    return outcome, time.perf_counter() - t, (res.stdout + res.stderr)[-1500:]


def apply(copy: Path, s: Sabotage) -> str:
    """Apply `s` in the copy; returns the original text of the file (to restore it)."""
    path = copy / s.file
    text = path.read_text()
    if text.count(s.old) != 1:
        raise ValueError(f"{s.file}: the sabotage's old text occurs {text.count(s.old)} times, not once: {s.why}")
    path.write_text(text.replace(s.old, s.new))
    return text


def check_copy_imports_itself(copy: Path) -> None:
    out = subprocess.run([sys.executable, "-c", "import esopt; print(esopt.__file__)"], cwd=copy,
                         env=environment(copy), capture_output=True, text=True, check=True).stdout.strip()
    if not out.startswith(str(copy)):
        raise RuntimeError(f"the copy imports esopt from {out}, not from {copy}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="modules to run (es/shaping, gate, ...)")
    ap.add_argument("--jobs", type=int, default=1, help="sabotages tested at once (one repo copy each)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per sabotage's test run")
    ap.add_argument("--list", action="store_true", help="list the sabotages and check that each still applies")
    ap.add_argument("--tests-from", type=Path, help="test a different tests/ tree (e.g. an older one)")
    args = ap.parse_args(argv)
    chosen = [s for s in SABOTAGES if not args.only or s.module in args.only]
    for s in chosen:  # every sabotage must still apply to the current code
        if (ROOT / s.file).read_text().count(s.old) != 1:
            print(f"STALE  {s.module}: {s.file}: {s.why} (its old text is not in the file exactly once)")
            return 1
    if args.list:
        for s in chosen:
            print(f"{s.module:16} {s.file:28} {s.why}")
        return 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="esopt-mutation-") as tmp:
        copies = [make_copy(Path(tmp) / f"copy{i}", args.tests_from) for i in range(max(args.jobs, 1))]
        for c in copies:
            (c / "tests").exists() or sys.exit(f"no tests/ in {c}")
        check_copy_imports_itself(copies[0])
        baseline_tests = tuple(sorted({t for s in chosen for t in s.tests}))
        outcome, secs, tail = run_tests(copies[0], baseline_tests, args.timeout * 3)
        print(f"baseline (no sabotage): {outcome} in {secs:.0f}s")
        if outcome != "passed":
            print(tail)
            return 1
        free = list(copies)

        def one(s: Sabotage):
            copy = free.pop()
            original = apply(copy, s)
            try:
                return s, *run_tests(copy, s.tests, args.timeout)
            finally:
                (copy / s.file).write_text(original)
                free.append(copy)

        results = []
        with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            for s, outcome, secs, tail in pool.map(one, chosen):
                verdict = {"failed": "killed", "timeout": "killed (timeout)", "passed": "SURVIVED"}.get(outcome,
                                                                                                        "ERROR")
                print(f"{verdict:17} {secs:5.0f}s  {s.module:16} {s.why}", flush=True)
                if outcome == "error":
                    print(tail)
                results.append((s, outcome))
    print("\nkilled/total per module:")
    modules = dict.fromkeys(s.module for s in chosen)
    for m in modules:
        mine = [o for s, o in results if s.module == m]
        print(f"  {m:16} {sum(o in ('failed', 'timeout') for o in mine)}/{len(mine)}")
    killed = sum(o in ("failed", "timeout") for _, o in results)
    print(f"  {'all':16} {killed}/{len(results)}   ({time.perf_counter() - t0:.0f}s)")
    survivors = [s for s, o in results if o not in ("failed", "timeout")]
    for s in survivors:
        print(f"SURVIVED: {s.module}: {s.file}: {s.why}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
