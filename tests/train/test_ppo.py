"""PPO: per-turn rewards, GAE by hand, the critic, one update on the tiny model, a 2-step run, configs."""

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
from esopt.train.pg import STATE_FILE, TurnSample, collate, minibatch_norm
from esopt.train.pg.ppo import PPO, Critic, PPOTrainConfig, explained_variance, gae, train, turn_rewards
from tests.tolerance import assert_close_up_to_rounding, network_rtol

TINY = {"model": {"name": "tiny"}, "env": {"kwargs": {"size": 4, "h_star": 2}},
        "sampling": {"max_new_tokens": 8}, "eval": {"every": 1, "tasks": 4}, "checkpoint_every": 1,
        "measure_inference_peak": False}


def make_traj(rewards: list[float], prompt: list[int], tokens: list[list[int]], success=False, shaped=0.0):
    t = Trajectory(task_seed=0)
    for k, (r, g) in enumerate(zip(rewards, tokens)):
        last = k == len(rewards) - 1
        info = {"is_success": success and last, "shaped_reward": shaped if last else shaped / 2}
        t.add(Turn("p", list(prompt), list(g), "t", None, r, last, False, info))
    return t


def test_gae_by_hand():
    # rewards 0, 0, 1; values 0.5, 0.6, 0.8; gamma 1, lambda 0.95; the value after the last turn is 0:
    # delta_2 = 1 + 0 - 0.8 = 0.2                 A_2 = 0.2
    # delta_1 = 0 + 0.8 - 0.6 = 0.2               A_1 = 0.2 + 0.95 * 0.2  = 0.39
    # delta_0 = 0 + 0.6 - 0.5 = 0.1               A_0 = 0.1 + 0.95 * 0.39 = 0.4705
    # returns = A + V = 0.9705, 0.99, 1.0
    adv, ret = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.8], gamma=1.0, lam=0.95)
    assert adv == pytest.approx([0.4705, 0.39, 0.2])
    assert ret == pytest.approx([0.9705, 0.99, 1.0])
    # gamma 0.9, lambda 1: A_t = discounted return - V_t
    # G = [0.9^2 * 1 + 0.9 * 0.5, 0.5 + 0.9 * 1, 1] = [1.26, 1.4, 1.0]
    adv, ret = gae([0.0, 0.5, 1.0], [0.2, 0.3, 0.4], gamma=0.9, lam=1.0)
    assert ret == pytest.approx([1.26, 1.4, 1.0]) and adv == pytest.approx([1.06, 1.1, 0.6])
    # lambda 0 is one-step TD: A_t = r_t + gamma V_{t+1} - V_t
    adv, _ = gae([0.0, 0.5, 1.0], [0.2, 0.3, 0.4], gamma=0.9, lam=0.0)
    assert adv == pytest.approx([0.9 * 0.3 - 0.2, 0.5 + 0.9 * 0.4 - 0.3, 0.6])
    assert gae([], [], 1.0, 0.95)[0].size == 0


def test_turn_rewards_by_kind():
    t = make_traj([0.1, 0.2, 0.3], [1], [[2], [2], [2]], success=True, shaped=0.6)
    assert turn_rewards(t, "env") == [0.1, 0.2, 0.3]
    assert turn_rewards(t, "success") == [0.0, 0.0, 1.0]
    assert turn_rewards(t, "shaped") == [0.0, 0.0, 0.6]
    assert turn_rewards(Trajectory(task_seed=0), "success") == []


def test_explained_variance():
    y = np.array([1.0, 2.0, 3.0])
    assert explained_variance(y, y) == 1.0
    assert explained_variance(np.zeros(3), y) == pytest.approx(1 - np.var(y) / np.var(y))
    assert explained_variance(y, np.ones(3)) is None


def test_critic_reads_the_last_prompt_token_only():
    model, tok = build_tiny_model(seed=2)
    critic = Critic.from_model(model)
    torch.nn.init.normal_(critic.head.weight)  # the real head starts at zero; make values non-trivial
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(critic.parameters(), model.parameters()))
    b = collate([TurnSample([5, 6, 7], [8, 9]), TurnSample([5, 6, 7], [30, 31, 32]), TurnSample([5, 6], [7])],
                pad_id=0)
    with torch.no_grad():
        v = critic(b)
    assert v.shape == (3,)
    atol = assert_close_up_to_rounding(v[0], v[1], network_rtol(model))  # the same prompt, padded differently
    assert (v[0] - v[2]).abs() > 10 * atol
    assert (Critic.from_model(model)(b) == 0).all()  # zero-initialised head


def test_one_update_changes_policy_and_critic_and_lowers_its_loss(encode):
    model, tok = build_tiny_model(seed=1)
    policy = HFEngine(model, tok)
    config = build_config({"algo": "ppo", "ppo": {"lr": 1e-3, "critic_lr": 1e-3, "epochs": 1, "minibatch_size": 64,
                                                  "micro_batch_size": 4}})
    p = encode(tok, "1 .2\n2 21\nok t3\n>")
    good, bad = encode(tok, "set 1 2 1<eos>"), encode(tok, "zzz")
    trajs = [make_traj([0.0, 1.0], p, [good, good]), make_traj([0.0], p, [bad]),
             make_traj([0.0, 0.0, 0.0], p, [bad, [], bad]), make_traj([1.0], p, [good])]
    algo = PPO(policy, None, config)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    critic_before = {k: v.detach().clone() for k, v in algo.critic.named_parameters()}
    batch = algo.prepare(trajs)
    assert len(batch) == 7  # the empty generation stays (for the value) but has no policy tokens
    assert batch.mask.sum(1).tolist().count(0.0) == 1
    assert (batch.old_values == 0).all()  # zero head: returns are lambda-discounted rewards-to-go
    assert batch.returns.tolist() == pytest.approx([0.95, 1, 0, 0, 0, 0, 1])
    everything = torch.arange(len(batch))
    with torch.no_grad():
        loss0, _ = algo.loss(batch, minibatch_norm(batch, everything))
    out = algo.update(trajs, step=0)
    assert out["optimizer_steps"] == 1 and out["grad_norm"] > 0 and out["value_grad_norm"] > 0
    assert {"approx_kl", "clipfrac", "value_loss", "explained_variance"} <= set(out)
    assert all(not torch.equal(v, before[k]) for k, v in model.named_parameters())
    assert not torch.equal(algo.critic.head.weight, critic_before["head.weight"])
    with torch.no_grad():
        loss1, _ = algo.loss(batch, minibatch_norm(batch, everything))
    assert loss1.item() < loss0.item()


def test_two_step_train_writes_run_dir_with_critic_and_resumes(tmp_path, resumed_like_uninterrupted, varied_env_id):
    config = build_config({"algo": "ppo", "steps": 2, **TINY, "env": {"id": varied_env_id, "kwargs": {}},
                           "ppo": {"tasks_per_step": 4, "epochs": 2, "minibatch_size": 16, "micro_batch_size": 16,
                                   "reward": "env", "lr": 1e-4, "critic_lr": 1e-3}})
    summary = train(config, tmp_path, progress=False)
    assert summary["steps_done"] == 2
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "final/model.safetensors",
                 f"checkpoints/step_000002/{STATE_FILE}", "plots/eval.png", "plots/reward_spread.png"):
        assert (tmp_path / name).exists(), name
    state = torch.load(tmp_path / "checkpoints/step_000002" / STATE_FILE, weights_only=True)
    assert "head.weight" in state["critic"] and len(state["optimizer"]["adamw"]["param_groups"]) == 2
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    for key in ("reward_mean", "reward_std", "success_rate", "loss", "clipfrac", "approx_kl",
                "explained_variance", "value_loss", "grad_norm", "generated_tokens", "peak_memory_bytes"):
        assert key in train_rows[0], key
    more = config.model_copy(update={"steps": 3})
    summary = train(more, tmp_path, resume=True, progress=False)
    assert summary["steps_done"] == 3
    # 2 steps + resume = 3 uninterrupted steps: same policy, same critic, same AdamW state
    resumed_state = resumed_like_uninterrupted(tmp_path, more, train)
    assert "head.weight" in resumed_state["critic"] and resumed_state["optimizer"]["adamw"]["state"]


def test_config_errors_and_shipped_configs():
    with pytest.raises(ConfigError) as e:
        build_config({"algo": "ppo", "ppo": {"lam": 1.5}})
    assert "\n" not in str(e.value) and str(e.value).startswith("config error: ppo.lam")
    root = Path(__file__).resolve().parents[2] / "configs"
    for name in ("ppo_smoke", "ppo_sudoku9_paper"):
        config = load_config(root / f"{name}.yaml")
        assert isinstance(config, PPOTrainConfig)
    assert config.episodes_per_step == 1024 and config.ppo.epochs == 4 and config.ppo.clip_eps == 0.2


def test_one_update_on_a_bf16_model_steps_fp32_masters_by_what_adamw_intends(encode):
    """PPO on a bf16 model at lr 1e-6, far below bf16's resolution: every policy and critic weight with a
    gradient moves by ~lr in its fp32 master (AdamW's first step is lr * g / (|g| + eps)), and the bf16 weights
    are the masters rounded. Plain bf16 AdamW would leave nearly all of them where they were."""
    model, tok = build_tiny_model(seed=1)
    model.to(torch.bfloat16)
    lr = 1e-6
    config = build_config({"algo": "ppo", "ppo": {"lr": lr, "critic_lr": lr, "epochs": 1, "minibatch_size": 64,
                                                  "micro_batch_size": 4, "max_grad_norm": 0}})
    p = encode(tok, "1 .2\n2 21\nok t3\n>")
    good, bad = encode(tok, "set 1 2 1<eos>"), encode(tok, "zzz")
    trajs = [make_traj([0.0, 1.0], p, [good, good]), make_traj([0.0], p, [bad]), make_traj([1.0], p, [good])]
    algo = PPO(HFEngine(model, tok), None, config)
    before = [m.detach().float().clone() for _, m in algo.optimizer.pairs]
    out = algo.update(trajs, step=0)
    assert out["optimizer_steps"] == 1
    moved = total = 0
    n_policy = len(list(model.parameters()))  # the pairs hold the policy's, then the critic's parameters
    for i, ((weight, master), start) in enumerate(zip(algo.optimizer.pairs, before, strict=True)):
        assert master.dtype == torch.float32
        assert torch.equal(weight.detach(), master.detach().to(weight.dtype))  # weights = masters rounded
        step = (master.detach() - start).abs()
        stepped = step > 0
        # AdamW's first step is ~lr wherever the gradient is not tiny against eps, and never above it
        assert (step[stepped] <= lr * 1.02 + torch.finfo(torch.float32).eps * start.abs()[stepped]).all()
        if i < n_policy:
            moved += int((step > 0.5 * lr).sum())
            total += step.numel()
    assert moved > 0.95 * total, (moved, total)  # bf16 alone: a step of 1e-6 is below the spacing of most weights
    # the critic's head starts at zero, so its first step moves the head (fp32) and not yet the bf16 backbone
    head = [m for w, m in algo.optimizer.pairs if w is algo.critic.head.weight][0]
    assert (head.detach().abs() > 0.5 * lr).all()
    assert all(w.dtype == torch.bfloat16 for w, _ in algo.optimizer.pairs[:n_policy])
