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
