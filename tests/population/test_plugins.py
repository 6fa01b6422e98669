"""A new population evaluator and a new inference engine plug in by one registry line each, with no edit to
any existing file: the registries are the only seam a new backend needs."""

from __future__ import annotations

import pytest
import torch

from esopt.engines import ENGINES
from esopt.engines.hf import HFEngine
from esopt.es import read_history
from esopt.population import EVALUATORS, run_member
from esopt.train.config import load_config
from esopt.train.es import train

SMOKE = ["steps=1", "eval.tasks=1", "eval.every=0", "es.tasks_per_member=4", "measure_inference_peak=false"]


class ReverseOrderEvaluator:
    """Runs the members last to first (a stand-in for any scheduling); results come back in member order."""

    calls = 0

    def __init__(self, context):
        self.context = context

    def evaluate(self, members, sigma, task_seeds, rollout_seed, spec):
        c = self.context
        type(self).calls += 1
        done = {m.index: run_member(c.es, c.engine, spec, c.make_env, m, sigma, task_seeds, rollout_seed, c.score)
                for m in reversed(members)}
        return [done[m.index] for m in members]

    def sync(self, record):
        pass

    def close(self):
        pass


class CountingEngine(HFEngine):
    """The HF engine, counting its generate calls (a stand-in for any engine with the same interface)."""

    generate_calls = 0

    def generate(self, prompts, sampling, seed=None, return_logprobs=False, members=None):
        type(self).generate_calls += 1
        return super().generate(prompts, sampling, seed, return_logprobs, members)


def test_a_new_evaluator_plugs_in_by_a_registry_line_and_gives_the_local_ledger(tmp_path, monkeypatch):
    monkeypatch.setitem(EVALUATORS, "reverse", ReverseOrderEvaluator)
    train(load_config("smoke", SMOKE), tmp_path / "local", progress=False)
    train(load_config("smoke", [*SMOKE, "es.evaluator=reverse"]), tmp_path / "reverse", progress=False)
    assert ReverseOrderEvaluator.calls == 1  # one call per generation: the run really used it
    local, reverse = read_history(tmp_path / "local/history.jsonl"), read_history(tmp_path / "reverse/history.jsonl")
    assert [r["rewards"] for r in reverse] == [r["rewards"] for r in local]  # member i's reward stays member i's
    assert len({x for r in local for x in r["rewards"]}) > 1


@pytest.mark.slow
def test_a_new_engine_plugs_in_by_a_registry_line(tmp_path, monkeypatch):
    monkeypatch.setitem(ENGINES, "counting", CountingEngine)
    train(load_config("smoke", SMOKE), tmp_path / "hf", progress=False)
    train(load_config("smoke", [*SMOKE, "model.engine=counting"]), tmp_path / "counting", progress=False)
    assert CountingEngine.generate_calls > 0
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "hf/final/model.safetensors"), load_file(tmp_path / "counting/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unknown_registry_names_fail_with_the_registered_ones(tmp_path):
    from esopt.engines import engine_class
    from esopt.population import evaluator_class

    with pytest.raises(ValueError, match=r"unknown engine 'nope'; registered: \['hf'"):
        engine_class("nope")
    with pytest.raises(ValueError, match=r"unknown population evaluator 'nope'; registered: \['batched', 'local'"):
        evaluator_class("nope")


def test_a_broken_registered_module_raises_its_own_import_error(monkeypatch):
    from esopt.population import evaluator_class

    monkeypatch.setitem(EVALUATORS, "broken", "esopt.population.no_such_module:Evaluator")
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        evaluator_class("broken")
