"""Supervised warm start on Sudoku oracle demonstrations."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from esopt.cli import main as cli_main
from esopt.envs.sudoku import SudokuEnv, oracle_move, parse_action
from esopt.rollout import build_markov_prompt
from esopt.train.sft import (
    Demo,
    encode_batch,
    iter_demos,
    lr_factor,
    random_invalid_move,
    take,
)


def test_demos_match_rollout_prompts_and_feedback(policy):
    demos = take(iter_demos(policy, {"size": 4}, (1, 12), seed=0, invalid_prob=0.3), 300)
    assert demos == take(iter_demos(policy, {"size": 4}, (1, 12), seed=0, invalid_prob=0.3), 300)
    env = SudokuEnv(size=4)
    for demo in demos[:50]:
        obs = demo.prompt[: -len("\n>")]
        assert demo.prompt == build_markov_prompt(policy, env.instructions, obs)  # the engine's markov prompt
        r, c, v = parse_action(demo.target, 4)
        assert demo.board[r - 1][c - 1] == 0 and demo.solution[r - 1][c - 1] == v
        assert demo.target == oracle_move(demo.board, demo.solution)
    # the status line (not a board row) shows feedback of invalid moves too
    status = {
        line.split()[0] for d in demos for line in d.prompt.split("\n") if line and not line[0].isdigit()
    }
    assert "ok" in status and {"given", "filled", "bad"} & status


def test_random_invalid_moves_are_rejected():
    rng = __import__("numpy").random.default_rng(0)
    env = SudokuEnv(size=4, h_star=6)
    env.reset(seed=1)
    for _ in range(30):
        board = env.board
        obs, _, term, trunc, info = env.step(random_invalid_move(board, rng))
        assert not info["action_is_valid"] and env.board == board
        if term or trunc:
            env.reset(seed=2)


def test_encode_batch_labels_only_on_target(policy):
    tok = policy.tokenizer
    grid = [[0] * 4 for _ in range(4)]
    demos = [Demo("ab\n>", "set 1 1 1", grid, grid), Demo("a\n>", "set 2 2 2", grid, grid)]
    batch = encode_batch(tok, demos)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape == (2, 4 + 9 + 1)
    assert labels[0, :4].eq(-100).all() and labels[0, 4:].tolist() == ids[0, 4:].tolist()
    assert labels[0, -1] == tok.eos_token_id
    assert labels[1, :3].eq(-100).all() and labels[1, -1] == -100 and mask[1, -1] == 0


@pytest.mark.slow
def test_short_pretrain_improves_accuracy_and_saves(tmp_path, capsys):
    out = tmp_path / "tiny-sudoku"
    argv = ["--steps", "150", "--seconds", "600", "--eval-every", "150", "--eval-states", "128"]
    argv += ["--eval-h-stars", "2", "--eval-episodes", "4"]
    # through the CLI: options directly after `pretrain` must reach its own parser
    assert cli_main(["pretrain", *argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "per-move accuracy" in printed and "multi-turn success H*=2 greedy" in printed
    metrics = json.loads((out / "pretrain_metrics.json").read_text())
    print(json.dumps({k: v for k, v in metrics.items() if k != "history"}))
    assert metrics["steps"] == 150 and metrics["stop_reason"] == "steps"
    assert metrics["initial_accuracy"] < 0.02 and metrics["initial_correct_move_rate"] < 0.05
    assert metrics["accuracy"] >= metrics["initial_accuracy"] + 0.04
    assert metrics["correct_move_rate"] >= metrics["initial_correct_move_rate"] + 0.08
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temp dir left behind
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok("1 12.4\n>", add_special_tokens=False)["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], len(tok))


def test_lr_factor_schedules():
    const = lr_factor("constant", 10, 100)
    assert const(0) == pytest.approx(0.1) and const(9) == 1.0 and const(99) == 1.0
    cos = lr_factor("cosine", 10, 110)
    assert cos(10) == pytest.approx(1.0) and cos(60) == pytest.approx(0.55) and cos(110) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="finite"):
        lr_factor("cosine", 10, float("inf"))
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_factor("linear", 10, 100)
