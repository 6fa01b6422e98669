"""Evaluators against hand-solved instances; the baselines' known behaviour; instance splits."""

import itertools

import numpy as np
import pytest

from esopt.envs.heuristics import HeuristicEvaluator, get_problem, tsp
from esopt.envs.heuristics import binpacking as bp

# items 5 6 3 4 2, capacity 10. First fit: 5|6, 3 joins 5, 4 joins 6, 2 joins 5+3 -> 2 bins.
# Best fit: 5|6, 3 joins 6 (room 1 < 2), 4 joins 5 (6+3 is full), 2 fits nowhere -> 3 bins.
HAND_ITEMS = [5, 6, 3, 4, 2]
HAND = {"items": HAND_ITEMS, "capacity": 10}


def test_first_and_best_fit_pack_the_hand_instance_as_by_hand():
    assert bp.first_fit(HAND_ITEMS, 10) == [0, 1, 0, 1, 0]
    assert bp.best_fit(HAND_ITEMS, 10) == [0, 1, 1, 0, 2]
    assert bp.l1_bound(HAND_ITEMS, 10) == 2
    p = bp.weibull()
    assert p.check(HAND, [0, 1, 0, 1, 0]) == 0.0  # 2 bins = the bound
    assert p.check(HAND, [0, 1, 1, 0, 2]) == 50.0  # 3 bins: 50% over
    with pytest.raises(ValueError, match="capacity"):
        p.check(HAND, [0, 0, 1, 1, 1])  # 5+6 > 10
    with pytest.raises(ValueError, match="list of 5"):
        p.check(HAND, [0, 1])


def test_sandboxed_baseline_codes_match_the_host_baselines():
    p = get_problem("binpacking-weibull", train_size=80, train_count=2)
    sets = {"hand": [HAND], "train": p.instances("train")}
    ev = HeuristicEvaluator(p, sets)
    assert ev.score(bp.FIRST_FIT, "hand").objective == 0.0
    assert ev.score(bp.BEST_FIT, "hand").objective == 50.0
    for name, code in p.baselines.items():
        host = np.mean([p.check(x, p.host_baselines()[name](x)) for x in sets["train"]])
        assert ev.score(code, "train").objective == pytest.approx(host)
    # L0 and L1 seeds reproduce best fit / first fit exactly
    assert ev.score(p.template.render((1.0, 0.0, 0.0)), "hand").objective == 50.0
    assert ev.score(p.expression.render("0 * r"), "hand").objective == 0.0


def test_tour_lengths_and_nearest_neighbour_by_hand():
    # unit square corners 0 (0,0), 1 (1,0), 2 (1,1), 3 (0,1): perimeter 4, a crossing tour 2 + 2*sqrt(2)
    square = {"xy": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    assert tsp.tour_length(square, [0, 1, 2, 3]) == pytest.approx(4.0)
    assert tsp.tour_length(square, [0, 2, 1, 3]) == pytest.approx(2 + 2 * 2 ** 0.5)
    with pytest.raises(ValueError, match="exactly once"):
        tsp.tour_length(square, [0, 1, 1, 3])
    # points on a line at x = 0, 1, 3, 7, 2: nearest neighbour from 0 goes 0 -> 1 -> 4 (x=2) -> 2 -> 3
    line = {"xy": [[0, 0], [1, 0], [3, 0], [7, 0], [2, 0]]}
    assert tsp.nearest_neighbour(tsp.distances(line)) == [0, 1, 4, 2, 3]
    p = get_problem("tsp")
    ev = HeuristicEvaluator(p, {"line": [line], "square": [square]})
    assert ev.score(tsp.NEAREST_NEIGHBOUR, "line").objective == pytest.approx(0.0)  # 14 = optimal on a line
    assert ev.score(p.template.render((1.0, 0.0, 0.0)), "square").objective == pytest.approx(0.0)


def test_reference_tour_is_optimal_on_small_instances_and_farthest_insertion_is_a_tour():
    p = get_problem("tsp")
    for inst in p.instances("val", size=8, count=3):
        d = tsp.distances(inst)
        best = min(tsp.tour_length(inst, [0, *perm]) for perm in itertools.permutations(range(1, 8)))
        assert tsp.tour_length(inst, tsp.reference_tour(inst)) == pytest.approx(best)
        fi = tsp.farthest_insertion(d)
        assert sorted(fi) == list(range(8))
        assert tsp.tour_length(inst, tsp.nearest_neighbour(d)) >= best - 1e-9


def test_splits_are_disjoint_and_reproducible():
    for name in ("binpacking-weibull", "binpacking-or", "tsp"):
        p = get_problem(name)
        a = p.instances("train", size=30, count=3)
        assert a == p.instances("train", size=30, count=3)  # by seed, every time
        b, c = p.instances("val", size=30, count=3), p.instances("test", size=30, count=3)
        keys = [str(x) for x in a + b + c]
        assert len(set(keys)) == len(keys)
    items = np.concatenate([x["items"] for x in get_problem("binpacking-or").instances("train", 200, 3)])
    assert items.min() >= 20 and items.max() <= 100
    w = np.concatenate([x["items"] for x in get_problem("binpacking-weibull").instances("train", 2000, 1)])
    assert 1 <= w.min() and w.max() <= 100 and 38 < w.mean() < 43  # Weibull(3, 45) has mean 40.2 (+0.5 ceil)
