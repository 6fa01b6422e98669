"""The search driver with a scripted model: EoH as specified (selection, population, budget), levels, ES
replay from the ledger, resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from esopt.envs.heuristics import get_problem
from esopt.es import read_history, replay
from esopt.search import HeuristicSearch, ScriptedEngine, SearchConfig, levels, rank_probabilities, select
from esopt.search.population import Individual, manage

SIZES = {"train_size": 100, "train_count": 1, "val_count": 1, "test_sizes": [40], "test_count": 1}
# train objectives on SIZES: -r 5.0 (best fit, = first fit here), -abs(r - 10) 7.5, -(r-40)**2 42.5, -r**2 5.0
L1_OUTPUTS = ["-r", "-abs(r - 10)", "bad (", "-(r-40)**2", "np.load(1)", "-r**2"]


def config(**kw) -> SearchConfig:
    base = dict(problem="binpacking-weibull", sizes=SIZES, level="L1", budget=20, population_size=3, batch_size=4,
                noise="normal")
    return SearchConfig(**{**base, **kw})


def test_rank_selection_probabilities_and_draws():
    p = rank_probabilities(3)
    assert np.allclose(p, np.array([1 / 4, 1 / 5, 1 / 6]) / (1 / 4 + 1 / 5 + 1 / 6))
    pop = [Individual(str(i), "", float(o), f"x{i}") for i, o in enumerate([3.0, 1.0, 2.0])]  # best is x1
    rng = np.random.default_rng(0)
    draws = [select(pop, 1, rng)[0].origin for _ in range(6000)]
    freq = [draws.count(o) / len(draws) for o in ("x1", "x2", "x0")]  # by rank
    assert (np.abs(np.array(freq) - p) <= 4 * np.sqrt(p * (1 - p) / len(draws))).all()  # 4 binomial SEs
    assert all(len({x.origin for x in select(pop, 2, rng)}) == 2 for _ in range(50))  # two different parents
    assert [x.origin for x in manage(pop, [Individual("d", "", 1.0, "dup")], 2)] == ["x1", "x2"]  # first kept


def test_config_plan_and_validation():
    assert config().plan() == ["i1", "e1", "e2", "m1", "m2"]
    assert config(scaffold="sampling").plan() == ["m1"] * 5
    assert [config(arm="es").perturbed(op) for op in ("i1", "e1", "e2", "m1", "m2")] == [0, 0, 0, 1, 1]
    assert not config(arm="frozen").perturbed("m1")
    assert config(arm="noise").es_config().alpha == 0.0 and config(arm="es").es_config().total_generations == 2
    with pytest.raises(ValueError, match="multiple of batch_size"):
        config(budget=18)


def test_levels_parse_what_a_small_model_writes():
    p = get_problem("binpacking-weibull")
    assert levels.parse("L0", p, "0.25 a=1.5 t=3.25 (lower is better)").text == "p=0.25 a=1.5 t=3.25"
    assert levels.parse("L0", p, "1, t=8, a=0 and more").text == "p=1 a=0 t=8"  # named values, any order
    assert levels.parse("L0", p, "2 0.5 9").text == "p=2 a=0.5 t=9"
    for bad in ("<number> t=<number>", "1.3 (cost 2.5)\np=2 a=1 t=3", "1e999 1 1"):
        with pytest.raises(ValueError):
            levels.parse("L0", p, bad)
    assert levels.parse("L1", p, " `-r + 1`;\nmore text").text == "-r + 1"
    code = levels.parse("L2", p, "    r = bins - item\n    return -r\nprint('x')\n").code
    assert code == "def priority(item, bins):\n    r = bins - item\n    return -r\n"
    messages, prefill = levels.prompt("L1", p, "e1", [levels.Parent("-r", 4.0), levels.Parent("0 * r", 5.0)])
    assert prefill == "score = " and "Parent 2: score = 0 * r (cost 5.000" in messages[1]["content"]


def test_eoh_run_with_a_scripted_model_behaves_as_specified(tmp_path):
    engine = ScriptedEngine(L1_OUTPUTS, mode="cycle")
    summary = HeuristicSearch(config(), engine, tmp_path, progress=False).run()
    # budget accounting: 20 proposals, invalid ones included; 14 of the cycled outputs are valid
    assert summary["proposals"] == 20 and len(engine.prompts) == 20
    assert summary["valid"] == 14 and summary["invalid_parse"] == 6 and summary["invalid_evaluate"] == 0
    lines = [json.loads(x) for x in (tmp_path / "batches.jsonl").read_text().splitlines()]
    assert [x["operator"] for x in lines] == ["i1", "e1", "e2", "m1", "m2"]
    seen = {5.0}  # the seeds: best fit and first fit tie on this instance, so the population starts with one
    pop_before = ["seed:expression -r"]
    for line in lines:
        for prop in line["proposals"]:
            assert set(prop["parents"]) <= set(pop_before)  # parents come from the population of the time
            assert len(prop["parents"]) == levels.PARENTS[line["operator"]]
            if levels.PARENTS[line["operator"]] == 2 and len(pop_before) >= 2:
                assert prop["parents"][0] != prop["parents"][1]
        seen |= {p["objective"] for p in line["proposals"] if p["objective"] is not None}
        assert [x["objective"] for x in line["population"]] == sorted(seen)[:3]  # greedy: the best 3 distinct
        pop_before = [x["origin"] for x in line["population"]]
    assert sorted(seen) == [5.0, 7.5, 42.5]
    # the prompts carry the operator's parents: i1 none, e1/e2 two, m1/m2 one
    assert "Parent" not in engine.prompts[0] and "Parent 2:" in engine.prompts[4] and "Parent:" in engine.prompts[12]
    # cache by code hash: "-r" (a seed) and repeats are scored once; 3 new train codes + val + test
    assert summary["sandbox_calls"] == 2 + 3 + 3 + 1
    assert summary["pick_val"] is not None and set(summary["pick_test"]) == {"test@40"}


def test_es_arm_replays_bit_exactly_from_its_ledger(tmp_path):
    engine = ScriptedEngine(L1_OUTPUTS, mode="hashed")
    summary = HeuristicSearch(config(arm="es", scaffold="sampling", budget=12), engine, tmp_path,
                              progress=False).run()
    history = read_history(tmp_path / "history.jsonl")
    assert len(history) == summary["es_generations"] == 3
    assert any(r["weights"] != [0.0] * 4 for r in history)  # members wrote different programs: a real update
    base = ScriptedEngine(L1_OUTPUTS, mode="hashed").model
    before = [p.clone() for p in base.parameters()]
    replay(base, history)
    assert all(torch.equal(a, b) for a, b in zip(base.parameters(), engine.model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(before, engine.model.parameters()))
    # noise only: members perturbed, never updated (alpha 0 in the ledger, the weights unchanged)
    noise = ScriptedEngine(L1_OUTPUTS, mode="hashed")
    HeuristicSearch(config(arm="noise", scaffold="sampling", budget=8), noise, tmp_path / "noise",
                    progress=False).run()
    assert all(r["alpha"] == 0.0 for r in read_history(tmp_path / "noise" / "history.jsonl"))
    assert all(torch.equal(a, b) for a, b in zip(before, noise.model.parameters()))


KILLER = textwrap.dedent("""
    import os, signal, sys
    from esopt.search import HeuristicSearch, ScriptedEngine, SearchConfig
    config = SearchConfig.model_validate_json(sys.argv[2])
    def hook(event, batch):  # the kill lands after an ES update is in the ledger, before its batch line
        if event == "told" and batch == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    HeuristicSearch(config, ScriptedEngine(OUTPUTS, mode="hashed"), sys.argv[1], hook=hook, progress=False).run()
""").replace("OUTPUTS", repr(L1_OUTPUTS))


def test_resume_after_sigkill_continues_exactly(tmp_path):
    cfg = config(arm="es", scaffold="sampling", budget=8, population_size=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "killed"), cfg.model_dump_json()],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-500:]
    assert len(read_history(tmp_path / "killed" / "history.jsonl")) == 2  # one update ahead of the batch lines
    assert len((tmp_path / "killed" / "batches.jsonl").read_text().splitlines()) == 1
    resumed_engine = ScriptedEngine(L1_OUTPUTS, mode="hashed")
    resumed = HeuristicSearch(cfg, resumed_engine, tmp_path / "killed", progress=False).run(resume=True)
    straight_engine = ScriptedEngine(L1_OUTPUTS, mode="hashed")
    straight = HeuristicSearch(cfg, straight_engine, tmp_path / "straight", progress=False).run()

    assert (tmp_path / "killed" / "batches.jsonl").read_text() == (tmp_path / "straight" / "batches.jsonl").read_text()
    assert read_history(tmp_path / "killed" / "history.jsonl") == read_history(tmp_path / "straight" / "history.jsonl")
    assert all(torch.equal(a, b) for a, b in zip(resumed_engine.model.parameters(), straight_engine.model.parameters()))
    assert resumed["pick"] == straight["pick"] and resumed["pick_test"] == straight["pick_test"]
    with pytest.raises(FileExistsError):
        HeuristicSearch(cfg, straight_engine, tmp_path / "straight", progress=False).run(resume=False)
