"""TSP, constructive, with EoH's interface: `select_next_node(current_node, destination_node, unvisited_nodes,
distance_matrix) -> node`. The tour starts at node 0 and returns to it (the destination); the heuristic picks
every next node from `unvisited_nodes`.

Instances: n points uniform in the unit square, Euclidean distances. The objective is the gap of the tour
length to a strong reference, in percent: the best of 2-opt + or-opt (segments of 1-3 nodes) local search
from nearest neighbour, farthest insertion and random starts (no exact solver installs offline here; on
9-node instances the reference equals brute force, see the tests, and its mean length on 20/50 nodes is
reported beside Concorde's published averages, 3.83 and 5.69).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from esopt.envs.heuristics.problem import Expression, Problem, Template

NEAREST_NEIGHBOUR = ("def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
                     "    return unvisited_nodes[np.argmin(distance_matrix[current_node, unvisited_nodes])]\n")

_RUNNER = '''
def solve(select, inst):
    xy = np.asarray(inst["xy"], dtype=float)
    d = np.sqrt(((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1))
    n = len(xy)
    tour, left = [0], list(range(1, n))
    while left:
        nxt = select(tour[-1], 0, np.array(left), d.copy())
        try:
            nxt = int(nxt)
        except (TypeError, ValueError):
            raise ValueError("select_next_node returned %r, not a node" % (nxt,)) from None
        if nxt not in left:
            raise ValueError("select_next_node returned node %d, which is not unvisited" % nxt)
        left.remove(nxt)
        tour.append(nxt)
    return tour
'''

_TEMPLATE = Template(
    names=("p", "a", "b"),
    formula="score = d_cur**p - a*d_mean + b*d_dest (lowest score is the next node)",
    code=("def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
          "    d_cur = distance_matrix[current_node, unvisited_nodes]\n"
          "    d_dest = distance_matrix[unvisited_nodes, destination_node]\n"
          "    d_mean = distance_matrix[np.ix_(unvisited_nodes, unvisited_nodes)].mean(axis=1)\n"
          "    score = d_cur ** {p} - {a} * d_mean + {b} * d_dest\n"
          "    return unvisited_nodes[np.argmin(score)]\n"),
    seeds=((1.0, 0.0, 0.0),),  # nearest neighbour
)

_EXPRESSION = Expression(
    variables=("d_cur (array: distance from the current node to each unvisited node), d_dest (from each unvisited "
               "node back to the start), d_mean (mean distance from each unvisited node to the other unvisited "
               "nodes), n_left (number of unvisited nodes)"),
    code=("def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
          "    d_cur = distance_matrix[current_node, unvisited_nodes]\n"
          "    d_dest = distance_matrix[unvisited_nodes, destination_node]\n"
          "    d_mean = distance_matrix[np.ix_(unvisited_nodes, unvisited_nodes)].mean(axis=1)\n"
          "    n_left = len(unvisited_nodes)\n"
          "    score = np.broadcast_to({expr}, d_cur.shape)\n"
          "    return unvisited_nodes[np.argmin(score)]\n"),
    seeds=("d_cur",),
    goal="lowest",
)


@dataclass
class TSP(Problem):
    def make_instance(self, rng: np.random.Generator, size: int) -> dict:
        xy = rng.random((size, 2))
        return {"xy": [[float(a), float(b)] for a, b in xy]}

    def check(self, instance: dict, solution) -> float:
        length = tour_length(instance, solution)
        return 100.0 * (length / reference_length(instance) - 1.0)

    def host_baselines(self) -> dict:
        return {"nearest neighbour": lambda inst: nearest_neighbour(distances(inst)),
                "farthest insertion": lambda inst: farthest_insertion(distances(inst)),
                "reference (2-opt + or-opt)": lambda inst: reference_tour(inst)}


def distances(instance: dict) -> np.ndarray:
    xy = np.asarray(instance["xy"], dtype=float)
    return np.sqrt(((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1))


def tour_length(instance: dict, tour) -> float:
    """Length of a closed tour, after checking it visits every node once and starts at node 0."""
    n = len(instance["xy"])
    if not isinstance(tour, list) or len(tour) != n or not all(isinstance(x, int) for x in tour):
        raise ValueError(f"expected a list of {n} integer nodes")
    if sorted(tour) != list(range(n)) or tour[0] != 0:
        raise ValueError("the tour must start at node 0 and visit every node exactly once")
    d, t = distances(instance), np.asarray(tour)
    return float(d[t, np.roll(t, -1)].sum())


def nearest_neighbour(d: np.ndarray, start: int = 0) -> list[int]:
    n = len(d)
    tour, left = [start], set(range(n)) - {start}
    while left:
        cur = tour[-1]
        nxt = min(left, key=lambda j: (d[cur, j], j))
        left.remove(nxt)
        tour.append(nxt)
    return tour


def farthest_insertion(d: np.ndarray) -> list[int]:
    """Start with node 0 and its farthest node; repeatedly take the unvisited node farthest from the tour
    and insert it where it lengthens the tour least."""
    n = len(d)
    if n < 3:
        return list(range(n))
    far = int(np.argmax(d[0]))
    tour, left = [0, far], set(range(n)) - {0, far}
    near = np.minimum(d[0], d[far])
    while left:
        k = max(left, key=lambda j: (near[j], -j))
        t = np.asarray(tour)
        nxt = np.roll(t, -1)
        cost = d[t, k] + d[k, nxt] - d[t, nxt]
        tour.insert(int(np.argmin(cost)) + 1, k)
        left.remove(k)
        near = np.minimum(near, d[k])
    return tour


def two_opt(tour: list[int], d: np.ndarray) -> list[int]:
    """2-opt and or-opt moves until no move shortens the tour (first improvement, vectorised per node)."""
    t = np.asarray(tour)
    n = len(t)
    improved = True
    while improved:
        improved = False
        for i in range(n - 1):
            a, b = t[i], t[i + 1]
            c, e = t[i + 2:], np.roll(t, -1)[i + 2:]
            if i == 0:
                c, e = c[:-1], e[:-1]  # the edge (t[n-1], t[0]) touches a
            delta = d[a, c] + d[b, e] - d[a, b] - d[c, e]
            if delta.size and delta.min() < -1e-12:
                j = i + 2 + int(np.argmin(delta))
                t[i + 1:j + 1] = t[i + 1:j + 1][::-1]
                improved = True
        t, moved = _or_opt(t, d)
        improved = improved or moved
    k = int(np.flatnonzero(t == 0)[0])
    return [int(x) for x in np.roll(t, -k)]


def _or_opt(t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, bool]:
    """Move one segment of 1-3 nodes to its best other place (or reversed) if that shortens the tour."""
    n = len(t)
    for length in (1, 2, 3):
        for i in range(n):
            seg = np.roll(t, -i)[:length]
            rest = np.roll(t, -i)[length:]
            if len(rest) < 2:
                continue
            prev, nxt = rest[-1], rest[0]
            gain = d[prev, seg[0]] + d[seg[-1], nxt] - d[prev, nxt]
            a, b = rest[:-1], rest[1:]
            fwd = d[a, seg[0]] + d[seg[-1], b] - d[a, b]
            rev = d[a, seg[-1]] + d[seg[0], b] - d[a, b]
            best = np.minimum(fwd, rev)
            k = int(np.argmin(best))
            if best[k] < gain - 1e-12:
                piece = seg if fwd[k] <= rev[k] else seg[::-1]
                return np.concatenate([rest[:k + 1], piece, rest[k + 1:]]), True
    return t, False


def reference_tour(instance: dict, restarts: int = 6, seed: int = 0) -> list[int]:
    d = distances(instance)
    n = len(d)
    rng = np.random.default_rng(seed)
    starts = [nearest_neighbour(d), farthest_insertion(d)]
    starts += [[0, *(int(x) + 1 for x in rng.permutation(n - 1))] for _ in range(restarts)]
    tours = [two_opt(s, d) for s in starts]
    lengths = [float(d[np.asarray(x), np.roll(np.asarray(x), -1)].sum()) for x in tours]
    return tours[int(np.argmin(lengths))]


_REFERENCE: dict[tuple, float] = {}


def reference_length(instance: dict) -> float:
    """The reference tour's length, computed once per instance and process."""
    key = tuple(map(tuple, instance["xy"]))
    if key not in _REFERENCE:
        tour = reference_tour(instance)
        d, t = distances(instance), np.asarray(tour)
        _REFERENCE[key] = float(d[t, np.roll(t, -1)].sum())
    return _REFERENCE[key]


def uniform(train_size: int = 50, train_count: int = 8, val_count: int = 8, test_sizes=(20, 50),
            test_count: int = 16) -> TSP:
    return TSP(
        name="tsp", function="select_next_node",
        arguments=("current_node", "destination_node", "unvisited_nodes", "distance_matrix"),
        description="TSP: a tour is built node by node from node 0 and returns to it; the heuristic picks the "
                    "next node. Shorter tours are better.",
        objective="gap of the tour length to the reference, %", train_size=train_size, train_count=train_count,
        val_count=val_count, test_sizes=tuple(test_sizes), test_count=test_count, template=_TEMPLATE,
        expression=_EXPRESSION, baselines={"nearest neighbour": NEAREST_NEIGHBOUR}, runner=_RUNNER)
