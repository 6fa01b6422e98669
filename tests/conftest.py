import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# Tests run under pytest-xdist on 2 cores: one intra-op thread per worker avoids OpenMP
# oversubscription, which slows small-model generation by >10x.
torch.set_num_threads(1)
os.environ.setdefault("ESOPT_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "esopt"))

# Property tests draw the same examples on every run (derandomize: examples from a hash of the test), so a
# failure reproduces and CI never sees a different sample than the last run did. HYPOTHESIS_PROFILE=explore
# draws fresh examples (and keeps a local example database) to hunt for new failures.
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", derandomize=False, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# What the suite writes at its peak: ~0.5 GB of SmolLM2 conversion in ESOPT_CACHE, plus the running tests' run
# dirs in the temp dir (a passing test's tmp_path is deleted at teardown, pyproject's retention policy).
DISK_NEEDED_GB = 1.5


def pytest_sessionstart(session):
    """Say so up front when the disk is short: ENOSPC mid-run fails tests at random, far from the cause."""
    import shutil
    import tempfile

    if hasattr(session.config, "workerinput"):  # xdist workers: the controller says it once
        return
    cache = os.path.abspath(os.path.expanduser(os.environ["ESOPT_CACHE"]))
    places = {"temp dir": tempfile.gettempdir(), "ESOPT_CACHE": cache}
    for name, path in places.items():
        while not os.path.exists(path):
            path = os.path.dirname(path)
        free_gb = shutil.disk_usage(path).free / 2**30
        if free_gb < DISK_NEEDED_GB:
            session.config.get_terminal_writer().line(
                f"WARNING: {free_gb:.2f} GiB free for the {name} ({path}); the suite writes ~{DISK_NEEDED_GB} GiB "
                "and tests will fail with 'No space left on device'", yellow=True)


@pytest.fixture(autouse=True)
def _quiet_tokenizers(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


def _tiny_engine(seed: int = 0, **engine_kwargs):
    from esopt.engines.hf import HFEngine
    from esopt.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=seed)
    return HFEngine(model, tokenizer, **engine_kwargs)


@pytest.fixture
def policy():
    """A fresh tiny engine (seed 0) per test: tests that perturb or train it cannot leak into others."""
    return _tiny_engine(0)


@pytest.fixture
def tiny_engine():
    """tiny_engine(seed=0, **HFEngine options) -> a fresh tiny engine (its model is `.model`)."""
    return _tiny_engine


@pytest.fixture
def encode():
    """encode(tokenizer, text) -> token ids without added special tokens (a written "<eos>" stays one token)."""
    return lambda tokenizer, text: tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture
def run_weights():
    """run_weights(run_dir, sub="final") -> {name: tensor} of the model a run saved there."""
    from safetensors.torch import load_file

    return lambda run_dir, sub="final": load_file(str(Path(run_dir) / sub / "model.safetensors"))


def assert_same_state(a, b, where: str = "") -> None:
    """Nested dicts/lists of tensors and numbers equal bit for bit (optimizer and critic states)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture
def same_state():
    """same_state(a, b): assert two nested states (tensors, dicts, lists, numbers) are identical."""
    return assert_same_state
