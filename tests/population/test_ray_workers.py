"""Ray population workers on a local cluster (CPU, fp32): same weights as one process, survive a killed
worker, catch a drifted one. Ray's files live under the test's tmp dir."""

import os
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
    (a token made under one HOME is not found under another in the same process)."""
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


def _weights(run):
    return load_file(str(run / "final" / "model.safetensors"))


@pytest.mark.slow
def test_two_ray_workers_give_the_single_process_weights_even_when_one_is_killed(tmp_path, monkeypatch):
    import esopt.population.ray as dist

    train(load_config("smoke", COMMON), tmp_path / "local", progress=False)
    real_evaluate, killed = dist.RayEvaluator.evaluate, []

    def evaluate_and_kill_one(self, members, sigma, task_seeds, rollout_seed, spec):
        if not killed:  # generation 1: kill worker 0 while members are running
            victim = self.actors[0]

            def kill():
                time.sleep(0.3)
                ray.kill(victim, no_restart=True)
                killed.append(victim)

            threading.Thread(target=kill, daemon=True).start()
        return real_evaluate(self, members, sigma, task_seeds, rollout_seed, spec)

    monkeypatch.setattr(dist.RayEvaluator, "evaluate", evaluate_and_kill_one)
    out = tmp_path / "ray"
    train(load_config("smoke", [*COMMON, "distributed.backend=ray", "distributed.workers=2"]), out, progress=False)
    assert killed and (out / "ray").is_dir()  # the local cluster's files live in the run dir
    a, b = _weights(tmp_path / "local"), _weights(out)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert (
        read_history(out / "history.jsonl")[0]["rewards"]
        == read_history(tmp_path / "local" / "history.jsonl")[0]["rewards"]
    )


@pytest.mark.slow
def test_a_drifted_replica_is_detected_and_replaced(tmp_path):
    from esopt.es import ES
    from esopt.population.ray import weights_checksum
    from esopt.train.es import population_evaluator
    from esopt.train.evaluate import rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory

    config = load_config("smoke", [*COMMON, "distributed.backend=ray", "distributed.workers=2"])
    policy = load_model(config.model, config.env.kwargs)
    es = ES(policy.model, config.es_config)
    logs = []
    make = env_factory(config)
    evaluator = population_evaluator(config, es, policy, make, run_dir=tmp_path, log=logs.append)
    try:
        members = es.ask(0)
        results = evaluator.evaluate(members, es.sigma, [11, 12], 3, rollout_spec(config, make))
        es.tell([r.reward + 0.01 * i for i, r in enumerate(results)])
        ray.get(evaluator.actors[1].corrupt.remote())
        evaluator.sync(es.last_record)
        assert any("drifted" in m for m in logs) and evaluator.replaced == 1, logs
        assert set(ray.get([a.checksum.remote() for a in evaluator.actors])) == {weights_checksum(policy.model)}
    finally:
        evaluator.close()
    assert os.path.isdir(tmp_path / "ray")
