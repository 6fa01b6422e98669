"""ES options the literature uses: fixed task sets, per-task fitness normalisation, greedy rollouts,
dense or binary scores, the antithetic disagreement rate and disjoint validation/test splits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from esopt.envs import make_env
from esopt.es.shaping import pair_disagreement, task_normalized
from esopt.rollout import env_examples
from esopt.train.config import ConfigError, build_config
from esopt.train.es import generation_tasks, train
from esopt.train.tasks import heldout_task_seeds, task_pool_seeds, train_task_seeds

TINY = [
    "steps=2", "model.name=tiny-sudoku", "model.warm_start_steps=60", "env.kwargs.size=4", "env.kwargs.h_star=3",
    "sampling.max_new_tokens=10", "eval.tasks=4", "eval.every=0", "checkpoint_every=5", "es.population_size=4",
    "es.antithetic=true", "es.tasks_per_member=4", "es.sigma=0.05", "es.sigma_min=0.005", "es.alpha=0.01",
    "es.reward=shaped", "measure_inference_peak=false",
]


def test_task_normalized_by_hand():
    scores = np.array([[1.0, 0.0, 0.5],
                       [0.0, 0.0, 0.5],
                       [1.0, 0.0, 0.5],
                       [0.0, 0.0, 0.5]])  # task 0 splits the members; tasks 1 and 2 carry no signal
    np.testing.assert_allclose(task_normalized(scores), [1 / 3, -1 / 3, 1 / 3, -1 / 3])
    # an easy task does not swamp a hard one: both count equally after normalisation
    scores = np.array([[0.9, 0.1], [0.8, 0.0]])
    np.testing.assert_allclose(task_normalized(scores), [1.0, -1.0])
    with pytest.raises(ValueError, match="members, tasks"):
        task_normalized(np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        task_normalized(np.array([[0.0, np.nan]]))


def test_pair_disagreement():
    assert pair_disagreement([1, 1, 0, 1, 2, 2], [1, -1, 1, -1, 1, -1]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="antithetic"):
        pair_disagreement([1, 2], [1, 1])


def test_fixed_task_set_is_reused_and_fresh_is_not():
    fixed = build_config({}, [*TINY, "es.task_set=fixed"])
    assert generation_tasks(fixed, 0) == generation_tasks(fixed, 7) == task_pool_seeds(0, 4)
    pooled = build_config({}, [*TINY, "es.task_set=fixed", "es.task_pool=10"])
    g0, g1 = generation_tasks(pooled, 0), generation_tasks(pooled, 1)
    assert len(g0) == 4 and len(set(g0)) == 4 and set(g0) | set(g1) <= set(task_pool_seeds(0, 10)) and g0 != g1
    fresh = build_config({}, TINY)
    assert generation_tasks(fresh, 0) == train_task_seeds(0, 0, 4) != generation_tasks(fresh, 1)
    with pytest.raises(ConfigError, match="task_pool"):
        build_config({}, [*TINY, "es.task_set=fixed", "es.task_pool=2"])


def test_validation_and_test_splits_are_disjoint_from_each_other_and_from_training():
    test = set(heldout_task_seeds(build_config({}, ["eval.tasks=500"])))
    validation = set(heldout_task_seeds(build_config({}, ["eval.tasks=500", "eval.split=validation"])))
    train_seeds = set(train_task_seeds(0, 0, 500)) | set(task_pool_seeds(0, 500))
    assert len(test) == len(validation) == 500
    assert not test & validation and not (test | validation) & train_seeds


def test_sudoku_show_empty_worked_examples_and_correctness():
    env = make_env("esopt/Sudoku-v0", size=4, h_star=2, show_empty=True)
    obs, _ = env.reset(seed=5)
    board = env.unwrapped.board
    empty = [f"{r + 1} {c + 1}" for r in range(4) for c in range(4) if not board[r][c]]
    assert obs.splitlines()[-2] == "empty: " + ", ".join(empty)
    assert obs in env.observation_space
    r, c = (int(x) for x in empty[0].split())
    right = env.unwrapped.task.solution[r - 1][c - 1]
    _, _, _, _, info = env.step(f"set {r} {c} {right % 4 + 1}")  # a wrong digit: valid, not correct
    assert info["action_is_valid"] and not info["action_is_correct"]
    assert "empty: " + empty[1] in env.step("nonsense")[0]
    state = env.unwrapped.board
    examples = env_examples(env, 3)
    assert env.unwrapped.board == state  # making examples leaves the episode alone
    assert examples == env_examples(make_env("esopt/Sudoku-v0", size=4, h_star=2, show_empty=True), 3)
    for ex_obs, move in examples:  # each example's move is a correct move on its board
        check = make_env("esopt/Sudoku-v0", size=4, h_star=2, show_empty=True)
        lines = ex_obs.splitlines()
        puzzle = "".join(line.split()[1] for line in lines[:4])
        check.reset(options={"puzzle": puzzle})
        info = check.step(move)[4]
        assert info["action_is_valid"] and info["action_is_correct"], (ex_obs, move)
    assert len({move for _, move in examples}) > 1


@pytest.mark.slow
def test_greedy_fixed_task_zscore_run_logs_the_new_diagnostics(tmp_path):
    opts = [*TINY, "sampling.temperature=0", "es.task_set=fixed", "es.fitness=task_zscore", "env.few_shot=1",
            "eval.split=validation"]
    out = tmp_path / "run"
    train(build_config({}, opts), out, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len(train_rows) == 2
    for r in train_rows:
        assert 0 <= r["pair_disagreement"] <= 1 and 0 <= r["valid_action_rate"] <= 1
        assert 0 <= r["correct_given_valid"] <= 1
    history = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    fitness = np.array(history[0]["rewards"])
    assert abs(fitness.mean()) < 1e-9 or np.all(fitness == 0)  # per-task z-scores average to zero
    # greedy rollouts: a second identical run gives identical fitness (no sampling noise at all)
    train(build_config({}, opts), tmp_path / "again", progress=False)
    again = [json.loads(x) for x in (tmp_path / "again" / "history.jsonl").read_text().splitlines()]
    assert again[0]["rewards"] == history[0]["rewards"]


def test_members_per_rollout_sets_the_rollout_batch_and_needs_a_batched_population():
    batched = [*TINY, "es.noise=lowrank", "es.batched=true", "es.population_size=6", "es.tasks_per_member=4"]
    assert build_config({}, batched).rollout_batch_size == 24
    assert build_config({}, [*batched, "es.members_per_rollout=4"]).rollout_batch_size == 16
    assert build_config({}, [*batched, "es.members_per_rollout=10"]).rollout_batch_size == 24
    with pytest.raises(ConfigError, match="members_per_rollout needs es.batched"):
        build_config({}, [*TINY, "es.members_per_rollout=2"])


def test_es_temperature_makes_members_greedy_while_evals_keep_the_runs_sampling():
    from esopt.train.evaluate import member_spec, rollout_spec
    from esopt.train.models import load_model
    from esopt.train.tasks import env_factory

    config = build_config({}, [*TINY, "sampling.temperature=1.0", "es.temperature=0"])
    make = env_factory(config)
    run_spec = rollout_spec(config, make)
    members = member_spec(run_spec, config)
    assert run_spec.sampling.temperature == 1.0 and members.sampling.temperature == 0
    assert member_spec(run_spec, build_config({}, TINY)) is run_spec  # unset: the run's own spec
    policy = load_model(config.model, config.env.kwargs)
    tasks = train_task_seeds(0, 0, 4)

    def actions(spec, seed):
        trajectories, _ = spec.run(policy, make, tasks, seed=seed)
        return [[turn.token_ids for turn in t.turns] for t in trajectories]

    # greedy members: the rollout seed no longer matters; the run's T=1 sampling does depend on it
    assert actions(members, 1) == actions(members, 2)
    assert actions(run_spec, 1) != actions(run_spec, 2)
    with pytest.raises(ConfigError, match="temperature"):
        build_config({}, [*TINY, "es.temperature=-1"])
