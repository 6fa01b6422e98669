"""`esopt bench efficiency`: an ES generation of each backend next to pure inference of the same recorded calls
(the same prompts and generated token counts), on the tiny model; and the GPU bench's one-call inference row."""

import json
import math

import pytest

from esopt.experiments import efficiency, gpu

BACKEND_ROWS = ("full-rank sequential", "low-rank in place", "low-rank batched")


def test_every_backend_is_set_beside_inference_of_the_same_tokens(tmp_path, capsys):
    assert efficiency.main(["--model", "tiny", "--members", "4", "--tasks", "2", "--repeats", "1", "--threads", "1",
                            "--no-memory", "--quiet", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "efficiency.json").read_text())
    rows = {r["backend"]: r for r in result["rows"]}
    assert tuple(rows) == BACKEND_ROWS
    for name, r in rows.items():
        assert r["generated_tokens"] > 0 and r["floor_generated_tokens"] == r["generated_tokens"], name
        assert r["prompt_tokens"] > 0 and r["calls"] > 0
        ratio = r["floor"] / r["seconds"]
        assert math.isfinite(ratio) and ratio > 0, name
        assert r["floor"] == min(x["seconds"] for x in r["layouts"].values()) and r["floor_layout"] in r["layouts"]
        phases = efficiency.gap_phases(r)  # the named phases and `other` add up to the gap
        assert sum(v for v in phases.values() if v is not None) == pytest.approx(r["seconds"] - r["floor"])
    assert rows["low-rank batched"]["hooks"] > 0 and rows["full-rank sequential"]["hooks"] is None
    assert rows["full-rank sequential"]["restore"] > 0 and rows["low-rank batched"]["calls"] < rows[
        "low-rank in place"]["calls"]  # one call per turn for the whole population
    out = capsys.readouterr().out
    assert ("| backend | seconds per generation | pure inference (best layout) seconds | ratio inference/backend | "
            "prefix-bound ceiling | ratio / ceiling | generated tokens | prompt tokens |") in out
    for r in rows.values():  # every member repeats the shared prefix: the ceiling is a ratio at most 1
        assert r["prefix_tokens"] > 0 and r["prefix_seconds"] > 0
        assert 0 < efficiency.ceiling(r, 4) < 1
    for name in BACKEND_ROWS:
        assert f"| {name} |" in out


def test_layouts_regroup_the_recorded_rows():
    calls = [efficiency.Call(t, [f"m{m}t{t}r{i}" for i in range(2)], [5, 5], [3, 4 - t], 0.0)
             for m in range(3) for t in range(2)]  # 3 members' rollouts, 2 turns each, 2 rows per call
    out = efficiency.layouts(calls, [4, 64, 100])
    assert list(out) == ["as recorded", "one call per turn", "batches of 4", "batches of 64"]  # 100 cuts as 64 does
    assert [len(out[n]) for n in out] == [6, 2, 3, 1]
    turn0, turn1 = out["one call per turn"]
    assert [p for p, _ in turn0] == [f"m{m}t0r{i}" for m in range(3) for i in range(2)]
    assert [n for _, n in turn1] == [3, 3] * 3
    rows = [r for chunks in out.values() for chunk in chunks for r in chunk]
    assert len(rows) == 4 * 12  # every layout holds every row once


def test_pure_inference_decodes_the_recorded_count_with_eos_disabled(tiny_engine):
    from esopt.engines.prefix import PrefixKV

    policy = tiny_engine(0)
    prompt = "1 12.4\n2 .4.2\n3 3..1\n4 43.1\nok the board is shown above, fill a cell\n>"
    rows = [(prompt + "a", 7), (prompt + "bc", 2), (prompt + "d", 0)]
    store = PrefixKV()
    assert efficiency.decode_rows(policy, rows, store) == 9
    assert store.layers and efficiency.decode_rows(policy, rows, store) == 9  # the prefix KV kept across calls
    assert store.reused_tokens > 0


def test_bad_input_is_one_clear_error():
    for argv, match in ((["--members", "3"], "even number"), (["--tasks", "0"], "--tasks must be >= 1"),
                        (["--floor-batches", "0"], "--floor-batches"),
                        (["--set", "max_batch_size=8"], "one generate call per turn")):
        with pytest.raises(ValueError, match=match):
            efficiency.main(["--model", "tiny", "--no-memory", "--quiet", *argv])
    with pytest.raises(ValueError, match="config error"):
        efficiency.main(["--model", "tiny", "--quiet", "--set", "es.sigma=-1"])


def test_gpu_bench_times_inference_in_one_call(capsys):
    assert gpu.main(["--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "--members", "2", "--batch", "2",
                     "--prompt-tokens", "4", "--new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "| best inference / mode |" in out and "| inference, one call |" in out
    assert "| 1.000 |" in out  # the fastest inference layout is its own floor


@pytest.mark.slow
def test_peak_memory_of_the_batched_backend_beside_inference_alone(tmp_path):
    assert efficiency.main(["--model", "tiny", "--members", "2", "--tasks", "1", "--repeats", "1", "--threads", "1",
                            "--backends", "batched", "--quiet", "--out", str(tmp_path)]) == 0
    (memory,) = json.loads((tmp_path / "efficiency.json").read_text())["memory"]
    assert memory["backend"] == "low-rank batched" and memory["rollout_batch"] == 2
    assert memory["peak"] > 0 and memory["inference_peak"] > 0


def test_the_prefix_bound_ceiling_charges_every_member_but_one_a_prefix_pass():
    row = {"floor": 10.0, "prefix_seconds": 0.5}
    assert efficiency.ceiling(row, 1) == 1.0  # one member: pure inference's own work
    assert efficiency.ceiling(row, 21) == pytest.approx(10.0 / (10.0 + 20 * 0.5))


def test_prefix_seconds_times_the_prompts_common_prefix(tiny_engine):
    policy = tiny_engine(0)
    board = "1 12.4\n2 .4.2\n3 3..1\n4 43.1\n>"
    calls = [efficiency.Call(t, [board + "1", board + "2"], [0, 0], [1, 1], 0.0) for t in range(2)]
    tokens, seconds = efficiency.prefix_seconds(policy, calls)
    assert tokens == len(policy.tokenizer(board, add_special_tokens=False)["input_ids"]) and seconds > 0
    assert efficiency.prefix_seconds(policy, [efficiency.Call(0, ["1", "2"], [0, 0], [1, 1], 0.0)]) == (0, 0.0)


@pytest.mark.slow  # four fresh processes
def test_memory_repeats_measure_each_side_in_fresh_processes_and_report_medians(tmp_path):
    assert efficiency.main(["--model", "tiny", "--members", "2", "--tasks", "1", "--repeats", "1", "--threads", "1",
                            "--backends", "batched", "--memory-repeats", "2", "--quiet", "--out", str(tmp_path)]) == 0
    (m,) = json.loads((tmp_path / "efficiency.json").read_text())["memory"]
    assert len(m["peaks"]) == len(m["inference_peaks"]) == 2
    assert all(x and x > 0 for x in m["peaks"] + m["inference_peaks"])
    assert m["peak"] == sum(m["peaks"]) / 2 and m["inference_peak"] == sum(m["inference_peaks"]) / 2  # median of two
    row = next(x for x in (tmp_path / "efficiency.md").read_text().splitlines() if x.startswith("| low-rank batched | ")
               and " = " in x)
    assert row.count(" = ") == 2  # both repeats listed
    with pytest.raises(ValueError, match="--memory-repeats must be >= 1"):
        efficiency.main(["--model", "tiny", "--memory-repeats", "0"])


def test_memory_children_run_with_a_fixed_mmap_threshold(monkeypatch):
    """Both sides' fresh processes get glibc's fixed mmap threshold, so a peak RSS is live memory on both."""
    import subprocess
    import types

    from esopt.train import memprobe
    from esopt.utils.memory import STEADY_MALLOC

    envs = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, env=None, **kw: envs.append(("es", env)) or
                        types.SimpleNamespace(returncode=0, stdout='{"peak": 3}\n', stderr=""))
    monkeypatch.setattr(memprobe, "inference_peak_bytes", lambda config, episodes, env=None:
                        envs.append(("inference", env)) or 2)
    args = efficiency.build_parser().parse_args(["--model", "tiny", "--backends", "batched", "--memory-repeats", "2"])
    (m,) = efficiency.measure_memory(args, [], lambda msg: None)
    assert m["peaks"] == [3, 3] and m["inference_peaks"] == [2, 2]
    assert [side for side, _ in envs] == ["es", "inference"] * 2
    for _, env in envs:
        assert env is not None and all(env[k] == v for k, v in STEADY_MALLOC.items())
