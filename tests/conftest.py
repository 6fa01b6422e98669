import os

import pytest
import torch

# Tests run under pytest-xdist on 2 cores: one intra-op thread per worker avoids OpenMP
# oversubscription, which slows small-model generation by >10x.
torch.set_num_threads(1)
os.environ.setdefault("ESOPT_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "esopt"))


@pytest.fixture(autouse=True)
def _quiet_tokenizers(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def policy():
    """A fresh tiny engine (seed 0) per test: tests that perturb or train it cannot leak into others."""
    from esopt.engines.hf import HFEngine
    from esopt.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model(seed=0)
    return HFEngine(model, tokenizer)
