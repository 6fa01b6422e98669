"""Online bin packing with FunSearch's interface: `priority(item, bins) -> scores`, the item goes to the
highest-scoring bin (ties: the first).

`bins` holds the remaining capacity of every open bin the item fits in, in opening order, then one empty bin
(capacity C) last. FunSearch passes every empty bin of a pre-allocated array; a priority that scores each
bin by its own capacity chooses exactly alike, and the shorter array keeps a 5k-item instance fast. A zero
priority is first fit, `-(bins - item)` best fit.

Families (items are integers, as in the OR library):
- `weibull`: Weibull(shape 3, scale 45) rounded up and clipped to [1, 100], capacity 100 (FunSearch's);
- `or`: uniform integers in [20, 100], capacity 150 (OR1-4 of Falkenauer).
The objective is the excess over the L1 bound ceil(sum / C), in percent, averaged over instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from esopt.envs.heuristics.problem import Expression, Problem, Template

FIRST_FIT = "def priority(item, bins):\n    return np.zeros_like(bins)\n"
BEST_FIT = "def priority(item, bins):\n    return -(bins - item)\n"

_RUNNER = '''
def solve(priority, inst):
    items, cap = inst["items"], float(inst["capacity"])
    rem = np.zeros(len(items))
    used, out = 0, []
    for item in items:
        item = float(item)
        fit = np.flatnonzero(rem[:used] >= item)
        cand = np.append(rem[fit], cap)
        s = np.asarray(priority(item, cand.copy()), dtype=float)
        if s.shape != cand.shape:
            raise ValueError("priority returned shape %s for %d bins" % (s.shape, len(cand)))
        if not np.all(np.isfinite(s)):
            raise ValueError("priority returned a score that is not finite")
        k = int(np.argmax(s))
        b = used if k == len(fit) else int(fit[k])
        if b == used:
            rem[used] = cap
            used += 1
        rem[b] -= item
        out.append(b)
    return out
'''

_TEMPLATE = Template(
    names=("p", "a", "t"),
    formula="score = -(r**p) - a*((r > 0) & (r < t)), r = room left in the bin after the item",
    code="def priority(item, bins):\n    r = bins - item\n    return -(r ** {p}) - {a} * ((r > 0) & (r < {t}))\n",
    seeds=((1.0, 0.0, 0.0),),  # best fit
)


def _expression(capacity: int) -> Expression:
    return Expression(
        variables=(f"item (size of the item), bins (array: room in each bin before the item; the last is an empty "
                   f"bin of {capacity}), r = bins - item (room left after the item), C = {capacity}"),
        code=f"def priority(item, bins):\n    r = bins - item\n    C = {float(capacity)!r}\n    return {{expr}}\n",
        seeds=("-r", "0 * r"),  # best fit, first fit
        goal="highest",
    )


@dataclass
class BinPacking(Problem):
    capacity: int = 100
    kind: str = "weibull"

    @property
    def family(self) -> str:
        return self.kind

    def make_instance(self, rng: np.random.Generator, size: int) -> dict:
        if self.kind == "weibull":
            items = np.clip(np.ceil(45.0 * rng.weibull(3.0, size)), 1, self.capacity)
        else:
            items = rng.integers(20, 101, size)
        return {"items": [int(x) for x in items], "capacity": self.capacity}

    def check(self, instance: dict, solution) -> float:
        items, cap = np.asarray(instance["items"], dtype=np.int64), int(instance["capacity"])
        bins = _as_int_list(solution, len(items), "bin")
        if bins.min() < 0 or bins.max() >= len(items):
            raise ValueError("a bin index is out of range")
        loads = np.bincount(bins, weights=items, minlength=len(items))
        if np.any(loads > cap):
            raise ValueError(f"bin {int(np.argmax(loads > cap))} holds {int(loads.max())} > capacity {cap}")
        return excess_percent(int(np.count_nonzero(loads)), items, cap)

    def host_baselines(self) -> dict:
        return {"first fit": lambda inst: first_fit(inst["items"], inst["capacity"]),
                "best fit": lambda inst: best_fit(inst["items"], inst["capacity"])}


def _as_int_list(solution, n: int, what: str) -> np.ndarray:
    if not isinstance(solution, list) or len(solution) != n or not all(isinstance(x, int) for x in solution):
        raise ValueError(f"expected a list of {n} integer {what} indices")
    return np.asarray(solution, dtype=np.int64)


def l1_bound(items, capacity: int) -> int:
    return max(1, math.ceil(int(np.sum(items)) / capacity))


def excess_percent(n_bins: int, items, capacity: int) -> float:
    bound = l1_bound(items, capacity)
    return 100.0 * (n_bins - bound) / bound


def first_fit(items, capacity: int) -> list[int]:
    """Reference first fit: each item into the first open bin it fits, else a new bin."""
    rem: list[int] = []
    out = []
    for x in items:
        b = next((i for i, r in enumerate(rem) if r >= x), len(rem))
        if b == len(rem):
            rem.append(capacity)
        rem[b] -= x
        out.append(b)
    return out


def best_fit(items, capacity: int) -> list[int]:
    """Reference best fit: each item into the open bin it leaves the least room in (ties: the first)."""
    rem: list[int] = []
    out = []
    for x in items:
        fits = [(r - x, i) for i, r in enumerate(rem) if r >= x]
        b = min(fits)[1] if fits else len(rem)
        if b == len(rem):
            rem.append(capacity)
        rem[b] -= x
        out.append(b)
    return out


def weibull(train_size: int = 1000, train_count: int = 4, val_count: int = 4, test_sizes=(1000, 5000),
            test_count: int = 5) -> BinPacking:
    return BinPacking(
        name="binpacking", function="priority", arguments=("item", "bins"),
        description="Online bin packing: items arrive one by one; each goes into the bin with the highest score "
                    "(a new bin if no open bin has room). Fewer bins is better. Capacity 100.",
        objective="excess over the L1 bound ceil(sum/C), %", train_size=train_size, train_count=train_count,
        val_count=val_count, test_sizes=tuple(test_sizes), test_count=test_count, template=_TEMPLATE,
        expression=_expression(100), baselines={"first fit": FIRST_FIT, "best fit": BEST_FIT}, runner=_RUNNER,
        capacity=100, kind="weibull")


def or_like(train_size: int = 250, train_count: int = 8, val_count: int = 8, test_sizes=(250, 500),
            test_count: int = 10) -> BinPacking:
    p = weibull(train_size, train_count, val_count, test_sizes, test_count)
    p.description = p.description.replace("Capacity 100", "Capacity 150")
    p.expression, p.capacity, p.kind = _expression(150), 150, "or"
    return p
