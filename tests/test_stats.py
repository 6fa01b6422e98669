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
