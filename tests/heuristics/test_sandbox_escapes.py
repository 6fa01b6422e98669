"""Model-written code: refused by the allowlist or stopped by the sandbox, and scored None (never a number)."""

import pytest

from esopt.envs.heuristics import HeuristicEvaluator, UnsafeCode, check_heuristic, get_problem

HEAD = "def priority(item, bins):\n"

REFUSED = {
    "import": HEAD + "    import os\n    return bins\n",
    "dunder import": HEAD + "    return __import__('os').system('id')\n",
    "open": HEAD + "    open('/etc/passwd')\n    return bins\n",
    "eval": HEAD + "    return eval('bins')\n",
    "exec": HEAD + "    exec('x = 1')\n    return bins\n",
    "dunder attribute": HEAD + "    return ().__class__.__bases__[0].__subclasses__()\n",
    "getattr": HEAD + "    return getattr(np, 'load')('x')\n",
    "numpy I/O": HEAD + "    return np.load('/etc/passwd')\n",
    "numpy file write": HEAD + "    bins.tofile('/tmp/x')\n    return bins\n",
    "globals": HEAD + "    return globals()\n",
    "print": HEAD + "    print('@@ESOPT-RESULT@@{}')\n    return bins\n",
    "raise": HEAD + "    raise SystemExit(0)\n",
    "lambda": HEAD + "    f = lambda x: x\n    return f(bins)\n",
    "class": "class A:\n    pass\n" + HEAD + "    return bins\n",
    "second statement": HEAD + "    return bins\nimport os\n",
    "wrong signature": "def priority(item, bins, extra):\n    return bins\n",
    "private name": HEAD + "    _x = bins\n    return _x\n",
    "syntax": HEAD + "    return (\n",
}

STOPPED = {
    "infinite loop": HEAD + "    while True:\n        pass\n",
    "memory bomb": HEAD + "    x = np.ones(10 ** 10)\n    return bins\n",
    "exception": HEAD + "    return bins / 0 + [1][5]\n",
    "not finite": HEAD + "    return bins * np.inf\n",
    "wrong shape": HEAD + "    return np.zeros(len(bins) + 1)\n",
    "scalar": HEAD + "    return 1.0\n",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_allowlist_refuses_escape_classes(case):
    with pytest.raises(UnsafeCode):
        check_heuristic(REFUSED[case], "priority", ("item", "bins"))


def test_refused_and_stopped_heuristics_score_none():
    p = get_problem("binpacking-weibull", train_size=30, train_count=1)
    ev = HeuristicEvaluator(p, {"train": p.instances("train")}, timeout=3)
    for case, code in {**REFUSED, **STOPPED}.items():
        s = ev.score(code, "train")
        assert s.objective is None and not s.valid and s.error, case
    assert "refused" in ev.score(REFUSED["import"], "train").error
    assert "time limit" in ev.score(STOPPED["infinite loop"], "train").error
    # the cache: a second score of the same code makes no sandbox call
    calls = ev.sandbox_calls
    assert ev.score(STOPPED["exception"], "train").cached and ev.sandbox_calls == calls


def test_infeasible_tsp_choice_scores_none():
    p = get_problem("tsp")
    ev = HeuristicEvaluator(p, {"t": p.instances("train", size=6, count=1)})
    head = "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
    assert ev.score(head + "    return current_node\n", "t").objective is None  # already visited
    assert ev.score(head + "    return 99\n", "t").objective is None
    assert ev.score(head + "    return unvisited_nodes[0]\n", "t").valid
