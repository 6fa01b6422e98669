"""Statistics helpers used for before/after comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from esopt.utils.stats import paired_difference


def test_paired_difference_interval():
    tasks, repeats = 64, 2
    rng = np.random.default_rng(0)
    before = rng.integers(0, 2, size=tasks * repeats)
    same = paired_difference(before, before, tasks)
    assert same.mean == same.low == same.high == 0.0
    after = before.copy()
    after[:40] = 1  # 40 episodes fixed, none broken
    up = paired_difference(before, after, tasks)
    assert up.mean == pytest.approx((after - before).mean()) and 0 < up.low <= up.mean <= up.high
    down = paired_difference(after, before, tasks)
    assert down.high < 0
    with pytest.raises(ValueError, match="do not split"):
        paired_difference(before[:-1], after[:-1], tasks)


def test_eval_plot_shows_paired_changes_with_intervals(tmp_path):
    from esopt.utils.plots import eval_changes, plot_evals

    rng = __import__("numpy").random.default_rng(0)
    first = [int(x) for x in rng.integers(0, 2, 200)]
    better = [1 if (a or i % 3 == 0) else 0 for i, a in enumerate(first)]
    evals = [{"step": 0, "success_rate": 0.5, "episode_success": first},
             {"step": 5, "success_rate": 0.5, "episode_success": list(first)},
             {"step": 10, "success_rate": 0.7, "episode_success": better}]
    changes = eval_changes(evals)
    assert changes[1][1:] == (0.0, 0.0, 0.0)  # no change: a flat zero, not a panel-filling jump
    step, mean, low, high = changes[2]
    assert step == 10 and 0 < low < mean < high
    assert plot_evals(evals, tmp_path / "eval.png").stat().st_size > 0
    assert eval_changes([{"step": 0, "success_rate": 0.1}]) == []  # rows without episode scores
