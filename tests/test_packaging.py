"""A wheel built from the repo, installed outside it (not editable), trains on a shipped config."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _checkout_state() -> dict[str, float]:
    """Top-level entries of the checkout (and the mtime of any build output there)."""
    return {p.name: p.stat().st_mtime if p.name == "build" or p.name.endswith(".egg-info") else 0.0
            for p in ROOT.iterdir()}


@pytest.mark.slow
def test_wheel_install_trains_on_a_shipped_config(tmp_path):
    wheels, site, work, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "work", tmp_path / "src"
    work.mkdir()
    # build from a copy of the sources: setuptools writes build/ and *.egg-info beside the pyproject it builds
    shutil.copytree(ROOT / "esopt", src / "esopt", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    before = _checkout_state()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, capture_output=True)
    assert _checkout_state() == before  # nothing written into the checkout
    (wheel,) = wheels.glob("agentic_esopt-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    where = subprocess.run([sys.executable, "-c", "import esopt; print(esopt.__file__)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True).stdout
    assert where.strip().startswith(str(site))  # the installed copy, not the checkout
    res = subprocess.run([sys.executable, "-m", "esopt.cli", "train", "smoke", "--out", "run", "--no-progress",
                          "steps=1", "eval.tasks=2", "measure_inference_peak=false"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (work / "run" / "final" / "model.safetensors").exists()
    assert "generation 1/1" in res.stdout
