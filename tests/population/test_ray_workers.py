"""Ray population workers on a local cluster (CPU, fp32): same weights as one process, survive a worker killed
while it holds a member and one that hangs, catch a drifted one. Ray's files live under the test's tmp dir.

Workers are parked at a named point (`esopt.utils.faults`, ESOPT_PAUSE_AT=rollout: the first member call to
arrive waits there, its weights perturbed) and the test acts once the point reports its pid: no sleeps."""

import fcntl
import json
import os
import signal
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

ray = pytest.importorskip("ray")

from esopt.es import read_history  # noqa: E402
from esopt.train.config import load_config  # noqa: E402
from esopt.train.es import train  # noqa: E402

COMMON = ["steps=2", "eval.tasks=2", "eval.every=0", "measure_inference_peak=false", "es.population_size=4"]


@pytest.fixture(autouse=True, scope="module")
def _ray_home(tmp_path_factory):
    """Ray keeps its auth token and session files under $HOME: one project-local HOME for the module
    (a token made under one HOME is not found under another in the same process). A file lock in the
    session's shared tmp root keeps two xdist workers from running local clusters at the same time."""
    with open(tmp_path_factory.getbasetemp().parent / "esopt-ray-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = {k: os.environ.get(k) for k in ("HOME", "RAY_USAGE_STATS_ENABLED")}
        os.environ["HOME"] = str(tmp_path_factory.mktemp("ray-home"))
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        yield
        if ray.is_initialized():
            ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def park_the_first_rollout(tmp_path, monkeypatch):
    """Processes started after this (Ray workers inherit the driver's environment) park the first member call
    that reaches a rollout; returns the dir of the handshake files: rollout.reached (pid and member of the
    parked call), rollout.log (every arrival). This process too: call it after any in-process training."""
    where = tmp_path / "pause"
    where.mkdir()
    monkeypatch.setenv("ESOPT_PAUSE_AT", "rollout")
    monkeypatch.setenv("ESOPT_PAUSE_DIR", str(where))
    return where


def wait_for(path, timeout_s=300.0) -> dict:
    deadline = time.time() + timeout_s
    while not path.exists():  # a file handshake: the worker is parked once the file exists
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)
    return json.loads(path.read_text())


def arrivals(where) -> list[dict]:
    return [json.loads(x) for x in (where / "rollout.log").read_text().splitlines()]


def recorded_replacements(monkeypatch) -> list[str]:
    import esopt.population.ray as dist

    why, real = [], dist.RayEvaluator._replace

    def replace(self, actor, reason):
        why.append(reason)
        return real(self, actor, reason)

    monkeypatch.setattr(dist.RayEvaluator, "_replace", replace)
    return why


def _weights(run):
    return load_file(str(run / "final" / "model.safetensors"))


@pytest.mark.slow
def test_two_ray_workers_give_the_single_process_weights_even_when_one_is_killed(tmp_path, monkeypatch):
    train(load_config("smoke", COMMON), tmp_path / "local", progress=False)
    paused_workers = park_the_first_rollout(tmp_path, monkeypatch)
    replaced = recorded_replacements(monkeypatch)
    parked = {}

    def kill_the_parked_worker():  # SIGKILL the worker process while it holds a member (perturbed)
        try:
            parked.update(wait_for(paused_workers / "rollout.reached", timeout_s=1200))
        except TimeoutError:  # never leave a worker parked: the run finishes and the asserts below fail
            (paused_workers / "rollout.go").touch()
            return
        os.kill(parked["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_parked_worker, daemon=True)
    killer.start()
    out = tmp_path / "ray"
    train(load_config("smoke", [*COMMON, "distributed.backend=ray", "distributed.workers=2"]), out, progress=False)
    killer.join(timeout=5)
    assert parked and (out / "ray").is_dir()  # the local cluster's files live in the run dir
    member = parked["member"]
    assert len(replaced) == 1 and replaced[0].startswith(f"died while evaluating member {member}: "), replaced
    runs = [a for a in arrivals(paused_workers) if a["member"] == member]
    # generation 1 ran the member on the killed worker, then again on another; generation 2 once more
    assert len(runs) == 3 and runs[0]["pid"] == parked["pid"] and runs[1]["pid"] != parked["pid"], runs
    assert sorted(a["member"] for a in arrivals(paused_workers)) == sorted([0, 1, 2, 3] * 2 + [member])
    a, b = _weights(tmp_path / "local"), _weights(out)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert read_history(out / "history.jsonl") == read_history(tmp_path / "local" / "history.jsonl")


@pytest.mark.slow
def test_a_hung_replica_and_a_drifted_one_are_replaced(tmp_path, monkeypatch):
    """A worker parked inside a member (it never returns) is replaced once the call runs past `timeout_s` and
    the member runs again elsewhere, with the rewards one process gets; then a replica whose weights drift
    after an update is caught by its checksum and rebuilt from the ledger."""
    from esopt.es import ES
    from esopt.population import run_member
    from esopt.population.ray import weights_checksum
    from esopt.train.es import population_evaluator
    from esopt.train.evaluate import rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory

    # 15 s: at 8 s a healthy member ran past the timeout too, with 3 processes on the 2 cores
    config = load_config("smoke", [*COMMON, "distributed.backend=ray", "distributed.workers=2",
                                   "distributed.timeout_s=15"])
    replaced = recorded_replacements(monkeypatch)
    paused_workers = park_the_first_rollout(tmp_path, monkeypatch)  # the driver's own run_member comes later
    policy = load_model(config.model, config.env.kwargs)
    es = ES(policy.model, config.es_config)
    logs = []
    make = env_factory(config)
    spec = rollout_spec(config, make)
    evaluator = population_evaluator(config, es, policy, make, run_dir=tmp_path, log=logs.append)
    try:
        members = es.ask(0)
        started = time.time()
        results = evaluator.evaluate(members, es.sigma, [11, 12], 3, spec)
        parked = json.loads((paused_workers / "rollout.reached").read_text())
        assert replaced == [f"member {parked['member']} ran past 15s"] and time.time() - started >= 15
        runs = [a["pid"] for a in arrivals(paused_workers) if a["member"] == parked["member"]]
        assert len(runs) == 2 and runs[0] == parked["pid"] != runs[1]  # parked, then run again on another worker
        local = [run_member(es, policy, spec, make, m, es.sigma, [11, 12], 3, config.es.reward) for m in members]
        assert [r.reward for r in results] == [r.reward for r in local]
        assert [[t.turns[-1].text for t in r.trajectories] for r in results] == [
            [t.turns[-1].text for t in r.trajectories] for r in local]

        es.tell([r.reward + 0.01 * i for i, r in enumerate(results)])
        ray.get(evaluator.actors[1].corrupt.remote())
        evaluator.sync(es.last_record)
        assert any("drifted" in m for m in logs) and evaluator.replaced == 2, logs
        assert set(ray.get([a.checksum.remote() for a in evaluator.actors])) == {weights_checksum(policy.model)}
    finally:
        evaluator.close()
    assert os.path.isdir(tmp_path / "ray")
