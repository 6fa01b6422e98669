"""GRPO: group advantages, per-turn samples, one update on the tiny model, a 2-step run, config errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from esopt.engines.hf import HFEngine
from esopt.models.tiny import build_tiny_model
from esopt.rollout import Trajectory, Turn
from esopt.train.config import ConfigError, build_config, load_config
from esopt.train.pg import STATE_FILE, batch_logprobs, collate, frozen_copy, minibatch_norm
from esopt.train.pg.grpo import GRPO, GRPOTrainConfig, group_advantages, grpo_samples, train
from tests.tolerance import ulps

TINY = {"model": {"name": "tiny"}, "env": {"kwargs": {"size": 4, "h_star": 2}},
        "sampling": {"max_new_tokens": 8}, "eval": {"every": 1, "tasks": 4}, "checkpoint_every": 1,
        "measure_inference_peak": False}


def traj(score: float, turns: list[tuple[list[int], list[int]]]) -> Trajectory:
    t = Trajectory(task_seed=0)
    for k, (p, g) in enumerate(turns):
        last = k == len(turns) - 1
        t.add(Turn("p", p, g, "t", None, score if last else 0.0, last, False, {"is_success": last and score > 0}))
    return t


# group_advantages divides by std + 1e-8 (fp64): a z-score z moves by about z * 1e-8 / std (|z| <= 3, std >= 0.1
# in these groups); fp64 rounding is far below that
EPS_SHIFT = 2 * 3 * 1e-8 / 0.1


def test_group_zscore_by_hand():
    scores = [1.0, 0.0, 1.0, 0.0, 0.1, 0.1, 0.1, 0.1, 3.0, 0.0, 0.0, 0.0]
    adv = group_advantages(scores, 4)
    # group 1: mean 0.5, std (ddof 0) 0.5 -> +-1
    assert adv[:4] == pytest.approx([1, -1, 1, -1], abs=EPS_SHIFT)
    # group 2: all equal (0.1 does not average exactly in floats) -> exactly 0, never NaN or a rounding blow-up
    assert (adv[4:8] == 0).all()
    # group 3: mean 0.75, std sqrt(mean([2.25^2, 0.75^2 x3])) = sqrt(1.6875)
    assert adv[8:] == pytest.approx(np.array([2.25, -0.75, -0.75, -0.75]) / np.sqrt(1.6875), abs=EPS_SHIFT)
    assert group_advantages([0.0, 0.0], 2).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages([1.0, 2.0, 3.0], 4)


def test_advantage_broadcast_to_every_turn_and_mask_exactly_generated():
    trajs = [traj(1.0, [([1, 2], [3, 4]), ([1, 5], [6])]),  # group 1: scores 1, 0 -> +1, -1
             traj(0.0, [([1, 2], [7]), ([1, 8], []), ([1, 9], [10, 11, 2])]),  # an empty generation in the middle
             traj(0.5, [([1, 2], [3])]),  # group 2: env scores 0.5, 0.7 -> -1, +1
             traj(0.7, [([1, 2], [4])])]
    samples, adv = grpo_samples(trajs, group_size=2, reward="env")
    assert adv == pytest.approx([1, -1, -1, 1], abs=EPS_SHIFT)
    assert [(s.traj, s.turn) for s in samples] == [(0, 0), (0, 1), (1, 0), (1, 2), (2, 0), (3, 0)]  # empty dropped
    assert [s.advantage for s in samples] == pytest.approx([1, 1, -1, -1, -1, 1], abs=EPS_SHIFT)
    b = collate(samples, pad_id=0)
    targets = b.input_ids[:, 1:]
    assert [targets[i][b.mask[i].bool()].tolist() for i in range(len(samples))] == \
        [s.token_ids for s in samples]
    assert b.mask.sum().item() == sum(len(s.token_ids) for s in samples)
    # success-based scores ignore the env reward: group 2 both succeeded -> zero advantage
    _, adv_s = grpo_samples(trajs, group_size=2, reward="success")
    assert adv_s == pytest.approx([1, -1, 0, 0], abs=EPS_SHIFT)


def test_task_seeds_form_contiguous_groups():
    config = build_config({"algo": "grpo", "grpo": {"tasks_per_step": 3, "group_size": 4}})
    model, tok = build_tiny_model()
    seeds = GRPO(HFEngine(model, tok), None, config).task_seeds(0)
    assert len(seeds) == 12 and len(set(seeds)) == 3
    assert all(len(set(seeds[i : i + 4])) == 1 for i in range(0, 12, 4))
    assert config.episodes_per_step == 12


def test_one_update_changes_every_weight_and_lowers_its_loss(encode):
    model, tok = build_tiny_model(seed=1)
    policy = HFEngine(model, tok)
    config = build_config({"algo": "grpo", "seed": 0, "grpo": {
        "group_size": 2, "lr": 1e-3, "kl_beta": 1e-3, "epochs": 1, "minibatch_size": 64, "micro_batch_size": 4}})
    p = encode(tok, "1 .2\n2 21\nok t3\n>")
    good, bad = encode(tok, "set 1 2 1<eos>"), encode(tok, "zzz")
    trajs = [traj(1.0, [(p, good), (p, good)]), traj(0.0, [(p, bad)]),
             traj(0.0, [(p, bad), (p, bad)]), traj(1.0, [(p, good)])]
    algo = GRPO(policy, frozen_copy(model), config)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    batch, _ = algo.prepare(trajs)
    assert batch.old_logprobs is None  # one epoch, one minibatch: on-policy, no separate pass
    batch.old_logprobs = batch_logprobs(model, batch, 1.0, 4)  # frozen, so the loss before/after compares
    everything = torch.arange(len(batch))
    with torch.no_grad():
        loss0, _ = algo.loss(batch, minibatch_norm(batch, everything))
    out = algo.update(trajs, step=0)
    assert out["optimizer_steps"] == 1 and out["grad_norm"] > 0 and out["samples"] == 6
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)
    with torch.no_grad():
        loss1, _ = algo.loss(batch, minibatch_norm(batch, everything))
    assert loss1.item() < loss0.item()
    # the reference stays frozen at the initial weights
    assert all(torch.equal(v, before[k]) for k, v in algo.ref.named_parameters())


def test_on_policy_step_without_the_old_logprob_pass_equals_the_step_with_it(encode):
    """One epoch of one minibatch: taking the old log-probs from the graph (ratio 1) gives the update that a
    separate no-grad pass would, and so does the clipped objective with two epochs (which keeps the pass)."""
    def run(epochs: int, skip: bool):
        model, tok = build_tiny_model(seed=1)
        config = build_config({"algo": "grpo", "seed": 0, "grpo": {
            "group_size": 2, "lr": 1e-3, "kl_beta": 1e-3, "epochs": epochs, "minibatch_size": 64,
            "micro_batch_size": 4}})
        p = encode(tok, "1 .2\n2 21\nok t3\n>")
        good, bad = encode(tok, "set 1 2 1<eos>"), encode(tok, "zzz")
        trajs = [traj(1.0, [(p, good)]), traj(0.0, [(p, bad)]), traj(0.0, [(p, bad)]), traj(1.0, [(p, good)])]
        algo = GRPO(HFEngine(model, tok), frozen_copy(model), config)
        if not skip:  # force the separate pass: the reference behaviour
            prepare = algo.prepare

            def with_pass(trajectories):
                batch, adv = prepare(trajectories)
                batch.old_logprobs = batch_logprobs(model, batch, algo.temperature, 4)
                return batch, adv
            algo.prepare = with_pass
        algo.update(trajs, step=0)
        return [v.detach().clone() for v in model.parameters()]

    for a, b in zip(run(1, skip=True), run(1, skip=False), strict=True):
        # ratio exactly 1 against exp(lp - lp') of two passes: the step rounds apart by a unit or two of w
        assert ((a - b).abs() <= 1e-3 * 1e-3 + ulps(b, 2)).all()
    two = run(2, skip=True)  # epochs=2 keeps the pass: the second epoch's ratio is not 1
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(two, run(1, skip=True)))


def test_two_step_train_writes_run_dir_and_resumes(tmp_path, resumed_like_uninterrupted, varied_env_id):
    config = build_config({"algo": "grpo", "steps": 2, **TINY, "env": {"id": varied_env_id, "kwargs": {}},
                           "grpo": {"tasks_per_step": 2, "group_size": 2, "minibatch_size": 16,
                                    "micro_batch_size": 16, "reward": "env", "lr": 1e-4}})
    summary = train(config, tmp_path, progress=False)
    assert summary["steps_done"] == 2 and not summary["interrupted"]
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "final/model.safetensors",
                 f"checkpoints/step_000002/{STATE_FILE}", "plots/eval.png", "plots/reward_spread.png"):
        assert (tmp_path / name).exists(), name
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2]
    for key in ("reward_mean", "reward_max", "reward_min", "reward_std", "success_rate", "mean_turns", "loss",
                "kl", "clipfrac", "approx_kl", "grad_norm", "generated_tokens", "seconds", "peak_memory_bytes"):
        assert key in train_rows[0], key
    assert load_config(tmp_path / "config.yaml").algo == "grpo"
    with pytest.raises(FileExistsError):
        train(config, tmp_path, progress=False)
    more = config.model_copy(update={"steps": 3})
    summary = train(more, tmp_path, resume=True, progress=False)
    assert summary["steps_done"] == 3
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert steps == [1, 2, 3]
    # 2 steps + resume = 3 uninterrupted steps: same weights and the same AdamW state (moments, step counts)
    resumed_state = resumed_like_uninterrupted(tmp_path, more, train)
    assert resumed_state["optimizer"]["adamw"]["state"]  # the moments exist (and are what was compared)


def test_linear_lr_schedule_is_transformers_linear_decay_and_reaches_the_optimizer(tmp_path, varied_env_id):
    """lr_schedule: linear scales every group's lr as transformers' linear schedule (TRL's default) does, step
    by step of the run; the run's metrics record the scale, and a checkpoint's lr never replaces the config's."""
    from transformers import get_linear_schedule_with_warmup

    from esopt.train.pg import lr_factor, make_optimizer

    w = torch.nn.Parameter(torch.zeros(2))
    reference = torch.optim.AdamW([w], lr=3e-5)
    schedule = get_linear_schedule_with_warmup(reference, 0, 5)
    for step in range(5):
        assert lr_factor("linear", step, 5) * 3e-5 == pytest.approx(reference.param_groups[0]["lr"], rel=1e-12)
        reference.step()
        schedule.step()
    assert lr_factor("constant", 4, 5) == 1.0
    section = GRPOTrainConfig().grpo
    opt = make_optimizer([("policy", [w], 2e-5), ("critic", [torch.nn.Parameter(torch.zeros(1))], 1e-3)], section)
    opt.scale_lr(0.25)
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(5e-6), pytest.approx(2.5e-4)]
    fresh = make_optimizer([("policy", [w], 2e-5), ("critic", [torch.nn.Parameter(torch.zeros(1))], 1e-3)], section)
    fresh.load_state_dict(opt.state_dict())  # a checkpoint taken at scale 0.25
    fresh.scale_lr(1.0)
    assert [g["lr"] for g in fresh.param_groups] == [pytest.approx(2e-5), pytest.approx(1e-3)]

    config = build_config({"algo": "grpo", "steps": 3, **TINY, "env": {"id": varied_env_id, "kwargs": {}},
                           "eval": {"every": 0, "tasks": 2}, "grpo": {
                               "tasks_per_step": 2, "group_size": 2, "minibatch_size": 16, "micro_batch_size": 16,
                               "reward": "env", "lr": 1e-4, "lr_schedule": "linear"}})
    train(config, tmp_path, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr_scale"] for r in rows if r["kind"] == "train"] == pytest.approx([1.0, 2 / 3, 1 / 3])
    with pytest.raises(ConfigError, match="lr_schedule"):
        build_config({"algo": "grpo", "grpo": {"lr_schedule": "cosine"}})


def test_malformed_config_is_one_line():
    with pytest.raises(ConfigError) as e:
        build_config({"algo": "grpo", "grpo": {"group_size": 1}})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config error: grpo.group_size")
    with pytest.raises(ConfigError, match="micro_batch_size"):
        build_config({"algo": "grpo"}, ["grpo.micro_batch_size=512", "grpo.minibatch_size=8"])
    with pytest.raises(ConfigError, match="grpo.nope"):
        build_config({"algo": "grpo", "grpo": {"nope": 1}})
    with pytest.raises(ConfigError, match="es"):
        build_config({"algo": "grpo", "es": {"sigma": 1}})


@pytest.mark.parametrize("name", ["grpo_smoke", "grpo_sudoku9_paper"])
def test_shipped_configs_validate(name):
    config = load_config(Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml")
    assert isinstance(config, GRPOTrainConfig)
    if name.endswith("paper"):
        g = config.grpo
        assert (g.group_size, g.lr, g.kl_beta, g.clip_eps) == (8, 1e-6, 1e-3, 0.2)
        assert config.episodes_per_step == 1024 and config.env.kwargs["size"] == 9 and config.env.kwargs["h_star"] == 10


def test_copies_of_a_task_in_one_batch_sample_independently():
    """A group's episodes share the task (same puzzle) but not the sampling stream."""
    from esopt.rollout import run_episodes
    from esopt.train.tasks import env_factory

    config = build_config({"algo": "grpo", **TINY, "sampling": {"temperature": 1.0, "max_new_tokens": 6},
                           "grpo": {"tasks_per_step": 2, "group_size": 4}})
    model, tok = build_tiny_model()
    policy = HFEngine(model, tok)
    seeds = GRPO(policy, None, config).task_seeds(0)
    trajs, _ = run_episodes(policy, env_factory(config), seeds, config.sampling.params(), seed=0)
    for g in range(2):
        group = trajs[4 * g : 4 * g + 4]
        assert len({t.turns[0].prompt for t in group}) == 1  # same puzzle
        assert len({tuple(t.turns[0].token_ids) for t in group}) > 1  # different samples
