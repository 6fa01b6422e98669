"""Test-time compute on scripted rollouts: Pass@k, best-of-N with the verifier, majority vote."""

import math

import pytest

from esopt.rollout import Trajectory, Turn
from esopt.testtime import answer_key, by_task, majority_vote, pass_at_k, summarize_test_time


def episode(answer: str, success: bool, info_answer=None) -> Trajectory:
    info = {"is_success": success, "action_is_valid": True}
    if info_answer is not None:
        info["answer"] = info_answer
    t = Trajectory(task_seed=0)
    t.add(Turn(prompt="p", prompt_ids=[1], token_ids=[2], text=answer, logprobs=None, reward=float(success),
               terminated=True, truncated=False, info=info))
    return t


def test_pass_at_k_matches_its_definition():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(3, 2, 2) == 1.0  # any 2 of 3 contain a success
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_majority_vote_and_answer_keys():
    # two agree on a wrong answer, one is right: the vote is wrong, best-of-3 (verifier) is right
    group = [episode("set 1 1 2", False), episode("SET 1  1 2", False), episode("set 1 1 3", True)]
    assert answer_key(group[0]) == answer_key(group[1])
    assert majority_vote(group) is False
    assert majority_vote([episode("a", True), episode("b", False)]) is True  # tie: the first answer
    assert majority_vote([episode("x", True, info_answer=7), episode("y", False, info_answer=7),
                          episode("z", False, info_answer=8)]) is True  # the env's own answer field


def test_summary_over_tasks_laid_out_sample_major():
    # 2 tasks x 3 samples; layout [t0 s0, t1 s0, t0 s1, t1 s1, t0 s2, t1 s2]
    t0 = [episode("a", False), episode("a", False), episode("b", True)]
    t1 = [episode("c", True), episode("c", True), episode("d", False)]
    flat = [t0[0], t1[0], t0[1], t1[1], t0[2], t1[2]]
    assert by_task(flat, 3) == [t0, t1]
    s = summarize_test_time(flat, 3)
    assert s["mean@3"] == pytest.approx(3 / 6)
    assert s["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert s["best_of_3"] == 1.0 and s["vote@3"] == 0.5
    with pytest.raises(ValueError, match="do not split"):
        summarize_test_time(flat[:5], 3)


def test_eval_cli_reports_test_time_compute(capsys):
    from esopt.cli import main

    assert main(["eval", "--model", "tiny", "--episodes", "2", "--rollouts-per-task", "3", "--max-new-tokens", "4",
                 "--samples", "0", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "mean@3" in out and "pass@1" in out and "best_of_3" in out and "vote@3" in out
    assert main(["eval", "--model", "tiny", "--rollouts-per-task", "2", "--temperature", "0"]) == 2
