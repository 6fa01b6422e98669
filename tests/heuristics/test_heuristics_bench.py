"""`esopt bench heuristics` end to end on its smoke preset with the scripted model, and its statistics."""

import json

from esopt.cli import main as cli_main
from esopt.experiments import heuristics


def test_paired_verdicts():
    assert heuristics.paired([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])["verdict"] == "tied"
    assert heuristics.paired([1.0, 1.9, 2.8], [2.0, 3.0, 4.0])["verdict"] == "improved"
    assert heuristics.paired([2.0, 3.1, 4.0], [1.0, 2.0, 3.0])["verdict"] == "worse"
    assert heuristics.paired([1.0, 3.0, 2.0], [2.0, 2.0, 2.0])["verdict"] == "tied"  # within one SE


def test_table_counts_improved_tied_worse():
    def runs(values):
        return [{"pick_test": {"test@20": v}} for v in values]

    results = [{"setting": "tsp:L0:eoh", "baselines": {"test@20": {"nearest neighbour": 16.0}},
                "runs": {"frozen": runs([3.0, 4.0, 5.0]), "noise": runs([2.0, 3.1, 3.9]), "es": runs([2.0, 3.0, 4.0])}}]
    text, counts = heuristics.table(results, ["frozen", "noise", "es"])
    assert counts == {"vs_frozen": {"improved": 1, "tied": 0, "worse": 0},
                      "vs_noise": {"improved": 0, "tied": 1, "worse": 0}}
    assert "| tsp:L0:eoh | test@20 | nearest neighbour 16.00 | 4.000 ± 0.577 |" in text


def test_bench_smoke_writes_the_table(tmp_path):
    rc = cli_main(["bench", "heuristics", "--smoke", "--model", "scripted", "--settings", "binpacking-weibull:L1:eoh",
                   "--arms", "es", "--run-dir", str(tmp_path / "runs"), "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    text = (tmp_path / "heuristics.md").read_text()
    assert "| binpacking-weibull:L1:eoh | test@60 |" in text and "ES vs frozen: improved" in text
    data = json.loads((tmp_path / "heuristics.json").read_text())
    runs = data["results"][0]["runs"]
    assert set(runs) == {"es"} and all(len(v) == 2 for v in runs.values())
    assert all(s["proposals"] == 8 for v in runs.values() for s in v)
