"""A ledger written by an older esopt (tests/fixtures/replay_v1, see make_replay_fixture.py) must replay
onto its base model to bit-identical weights with today's code."""

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from esopt.es import read_history, replay

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "replay_v1"


def test_fixture_ledger_replays_bit_exactly():
    model = AutoModelForCausalLM.from_pretrained(FIXTURE / "base", dtype=torch.float32)
    expected = load_file(str(FIXTURE / "final.safetensors"))
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    records = read_history(FIXTURE / "history.jsonl")
    assert len(records) == 5 and all(r["alpha"] > 0 for r in records)
    replay(model, records)
    got = dict(model.named_parameters())
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert torch.equal(got[name].detach(), want), name
    # the update is real: most weights moved away from the base
    moved = sum(int((got[n].detach() != base[n]).sum()) for n in base)
    assert moved > 0.9 * sum(t.numel() for t in base.values())
