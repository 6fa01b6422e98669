"""Sudoku: generator, validator, solver, parser, task files and the environment's turn logic."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esopt.envs.sudoku import (
    BOX_SHAPES,
    MAX_PARSE_CHARS,
    SudokuEnv,
    SudokuTask,
    count_solutions,
    generate_task,
    is_valid_solution,
    load_tasks_jsonl,
    make_task_set,
    oracle_move,
    parse_action,
    save_tasks_jsonl,
    solve,
)

# ------------------------------------------------------------------ independent reference implementations


def brute_valid(grid, puzzle) -> bool:
    """Set-based validity check, written independently of is_valid_solution."""
    n = len(grid)
    if n not in BOX_SHAPES or any(len(row) != n for row in grid):
        return False
    br, bc = BOX_SHAPES[n]
    digits = set(range(1, n + 1))
    units = [set(row) for row in grid]
    units += [{grid[r][c] for r in range(n)} for c in range(n)]
    units += [
        {grid[r][c] for r in range(r0, r0 + br) for c in range(c0, c0 + bc)}
        for r0 in range(0, n, br)
        for c0 in range(0, n, bc)
    ]
    if any(u != digits for u in units):
        return False
    return all(not puzzle[r][c] or puzzle[r][c] == grid[r][c] for r in range(n) for c in range(n))


def all_4x4_grids() -> list[list[list[int]]]:
    """Every valid 4x4 Sudoku (there are 288): rows are permutations, pruned on repeated columns."""
    perms = [list(p) for p in itertools.permutations(range(1, 5))]
    out = []

    def extend(rows):
        if len(rows) == 4:
            if brute_valid(rows, [[0] * 4 for _ in range(4)]):
                out.append([row[:] for row in rows])
            return
        for p in perms:
            if all(p[c] != row[c] for row in rows for c in range(4)):
                extend(rows + [p])

    extend([])
    return out


def holes(puzzle) -> int:
    return sum(v == 0 for row in puzzle for v in row)


# ---------------------------------------------------------------------------------------- generator


@pytest.mark.parametrize("size", [4, 6, 9])
def test_generator_valid_grids_exact_holes(size):
    rng = np.random.default_rng(size)
    for seed in range(60):
        h = int(rng.integers(1, size * size + 1)) if seed % 3 else [1, 5, size * size][seed % 9 // 3]
        task = generate_task(np.random.default_rng(seed), size, h)
        assert task.size == size and task.h_star == h == holes(task.puzzle)
        assert brute_valid(task.solution, task.puzzle)
        assert all(
            p == 0 or p == s for prow, srow in zip(task.puzzle, task.solution) for p, s in zip(prow, srow)
        )


def test_generator_covers_many_grids():
    # The shuffles reach 96 of the 288 4x4 grids (one of the two essentially different 4x4 Sudokus)
    grids = {json.dumps(generate_task(np.random.default_rng(s), 4, 1).solution) for s in range(600)}
    assert len(grids) == 96
    grids = {json.dumps(generate_task(np.random.default_rng(s), 6, 1).solution) for s in range(300)}
    assert len(grids) > 280


def test_unique_4x4_checked_against_all_grids():
    grids = all_4x4_grids()
    assert len(grids) == 288
    for seed in range(12):
        for h in (3, 6, 9):
            task = generate_task(np.random.default_rng(seed), 4, h, unique=True)
            assert holes(task.puzzle) == h
            completions = [g for g in grids if brute_valid(g, task.puzzle)]
            assert completions == [task.solution]


def test_unique_9x9_h10():
    for seed in range(3):
        task = generate_task(np.random.default_rng(seed), 9, 10, unique=True)
        assert holes(task.puzzle) == 10 and count_solutions(task.puzzle, 9) == 1


def test_unique_impossible_raises_clear_error():
    with pytest.raises(ValueError, match="uniquely solvable 4x4 puzzle with h_star=16"):
        generate_task(np.random.default_rng(0), 4, 16, unique=True)


@pytest.mark.parametrize(
    "size,h_star,match",
    [(5, 3, "size"), (4, 0, "h_star"), (4, 17, "h_star"), (9, 2.5, "h_star"), (6, True, "h_star")],
)
def test_generate_task_validates_args(size, h_star, match):
    with pytest.raises(ValueError, match=match):
        generate_task(np.random.default_rng(0), size, h_star)


# ------------------------------------------------------------------------------------ validator / solver


def test_validator_agrees_with_brute_force():
    rng = np.random.default_rng(1)
    checked = {True: 0, False: 0}
    for i in range(400):
        size = [4, 6, 9][i % 3]
        task = generate_task(rng, size, int(rng.integers(1, size * size)))
        grid = [row[:] for row in task.solution]
        kind = i % 5
        if kind == 1:  # swap two cells
            (r1, c1), (r2, c2) = rng.integers(0, size, (2, 2))
            grid[r1][c1], grid[r2][c2] = grid[r2][c2], grid[r1][c1]
        elif kind == 2:  # change one cell
            r, c = rng.integers(0, size, 2)
            grid[r][c] = int(rng.integers(0, size + 2))
        elif kind == 3:  # random digits
            grid = rng.integers(1, size + 1, (size, size)).tolist()
        elif kind == 4:  # a different valid grid: givens decide
            grid = generate_task(rng, size, 1).solution
        expected = brute_valid(grid, task.puzzle)
        assert is_valid_solution(grid, task.puzzle) == expected
        checked[expected] += 1
    assert min(checked.values()) > 50


@pytest.mark.parametrize(
    "grid", [[], [[1]], [[1, 2], [2, 1]], None, "1234", [[1, 2, 3, 4]] * 3, [[1, 2, 3], [3, 1, 2], [2, 3, 1]]]
)
def test_validator_rejects_malformed(grid):
    assert is_valid_solution(grid, None) is False


def test_validator_rejects_digit_permuted_rows_that_break_boxes():
    grid = [[1, 2, 3, 4], [2, 3, 4, 1], [3, 4, 1, 2], [4, 1, 2, 3]]  # rows and columns fine, boxes not
    assert not is_valid_solution(grid, None) and not brute_valid(grid, [[0] * 4] * 4)


def test_solver_and_counter():
    assert count_solutions([[0] * 4 for _ in range(4)], 4, limit=1000) == 288
    for seed in range(5):
        task = generate_task(np.random.default_rng(seed), 9, 50)
        sol = solve(task.puzzle, 9)
        assert sol is not None and brute_valid(sol, task.puzzle)
    bad = [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert solve(bad, 4) is None and count_solutions(bad, 4) == 0
    # conflict-free givens, but r1c1 has no candidate (row: 2 3, box: 1, column: 4)
    dead_end = [[0, 0, 2, 3], [0, 1, 0, 0], [4, 0, 0, 0], [0, 0, 0, 0]]
    assert solve(dead_end, 4) is None and count_solutions(dead_end, 4) == 0


def test_oracle_move():
    task = generate_task(np.random.default_rng(3), 6, 4)
    move = oracle_move(task.puzzle, task.solution)
    r, c, v = parse_action(move, 6)
    assert move == f"set {r} {c} {v}" and task.puzzle[r - 1][c - 1] == 0 and task.solution[r - 1][c - 1] == v
    assert oracle_move(task.puzzle, None) == oracle_move(task.puzzle, solve(task.puzzle, 6))
    with pytest.raises(ValueError, match="no empty cell"):
        oracle_move(task.solution, task.solution)


# ------------------------------------------------------------------------------------------- parser

VALID_FORMS = {
    "set 2 3 4": (2, 3, 4),
    "SET 2 3 4": (2, 3, 4),
    "Set 2,3,4": (2, 3, 4),
    "set 2, 3, 4": (2, 3, 4),
    "set(2, 3, 4)": (2, 3, 4),
    "  set 2 3 4.  ": (2, 3, 4),
    "r2c3=4": (2, 3, 4),
    "R2C3 = 4": (2, 3, 4),
    "r2 c3 4": (2, 3, 4),
    "r2, c3, 4": (2, 3, 4),
    "set r2c3=4": (2, 3, 4),
    "row 2 col 3 = 4": (2, 3, 4),
    "2 3 4": (2, 3, 4),
    "(2, 3, 4)": (2, 3, 4),
    '{"row": 2, "col": 3, "value": 4}': (2, 3, 4),
    '{"r":2,"c":3,"v":4}': (2, 3, 4),
    '{"Row": "2", "column": 3, "value": 4}': (2, 3, 4),
    "{'row': 2, 'col': 3, 'value': 4}": (2, 3, 4),
    "I think the answer is:\nset 2 3 4": (2, 3, 4),
    "first set 1 1 9 (bad)\nset 2 3 4\nset 4 4 4": (2, 3, 4),
    "set 2 3 4\nset 1 1 1": (2, 3, 4),
    "r2c3=4 then set 1 1 1": (2, 3, 4),
    '{"row": 2,\n "col": 3,\n "value": 4}': (2, 3, 4),
    "set 02 03 04": (2, 3, 4),
}


@pytest.mark.parametrize("text,expected", list(VALID_FORMS.items()))
def test_parser_tolerant_forms(text, expected):
    assert parse_action(text, 4) == expected


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("set 0 1 1", "row 0 out of range 1..4"),
        ("set 1 5 1", "column 5 out of range"),
        ("set 1 1 0", "value 0 out of range"),
        ("set 1 1 123456789012345678901234567890", "value >999 out of range"),
        ('{"row": 9, "col": 1, "value": 1}', "row 9 out of range"),
        ("set r c v", "could not parse"),
        ("hello", "could not parse"),
        ("r2c34", "could not parse"),
        ('{"row": true, "col": 1, "value": 1}', "could not parse"),
        ("", "empty"),
        ("   \n ", "empty"),
        (None, "empty"),
        ("1 2 3 and more", "could not parse"),
    ],
)
def test_parser_errors(text, fragment):
    out = parse_action(text, 4)
    assert isinstance(out, str) and fragment in out


def test_parser_truncates_and_handles_odd_inputs():
    assert parse_action("x" * 10**6 + "set 1 1 1", 4) == parse_action("x", 4)
    assert parse_action("set 1 1 1" + "x" * 10**6, 4) == (1, 1, 1)
    assert parse_action(" " * (MAX_PARSE_CHARS - 9) + "set 1 1 1", 4) == (1, 1, 1)
    assert parse_action(" " * (MAX_PARSE_CHARS - 8) + "set 1 1 1", 4) != (1, 1, 1)
    assert parse_action(b"set 1 2 3", 4) == (1, 2, 3)
    assert parse_action(b"\xff\xfe", 4) == parse_action("x", 4)
    assert parse_action(123, 9) == parse_action("x", 9)
    assert parse_action("sét 1 2 3 → set 3 2 1 ✓", 4) == (3, 2, 1)
    assert parse_action("٣ ٢ ١", 4) == parse_action("x", 4)  # non-ASCII digits are not moves
    assert parse_action("set 9 9 9", 9) == (9, 9, 9) and isinstance(parse_action("set 9 9 9", 6), str)


_TOKENS = [
    "set",
    "SET",
    "Set(",
    " ",
    "  ",
    ",",
    ", ",
    "=",
    ":",
    "\n",
    "r",
    "c",
    "R",
    "C",
    "row ",
    "col ",
    "(",
    ")",
    "{",
    "}",
    '"row":',
    '"col":',
    '"value":',
    "'v':",
    '"r":',
    "0",
    "1",
    "2",
    "3",
    "4",
    "6",
    "9",
    "10",
    "-1",
    "99999999999999999999",
    "\u00e9",
    "\u2192",
    "\x00",
    ".",
    "set 1 2 3",
    "r2c3=4",
    "junk",
    "\t",
    "[",
    "]",
]


def _near_valid(seed: int) -> str:
    """A string assembled from move-like tokens (a local Random: cheaper for hypothesis than st.lists)."""
    rng = random.Random(seed)
    return "".join(rng.choice(_TOKENS) for _ in range(rng.randrange(16)))


@settings(max_examples=10_000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.text(), st.integers(0, 2**64).map(_near_valid)), st.sampled_from([4, 6, 9]))
def test_parser_never_raises_fuzz(text, size):
    out = parse_action(text, size)
    if isinstance(out, tuple):
        assert len(out) == 3 and all(type(x) is int and 1 <= x <= size for x in out)
    else:
        assert isinstance(out, str) and out.startswith("invalid:") and out.isascii()


_FORMS = [
    "set {r} {c} {v}",
    "SET {r},{c},{v}",
    "r{r}c{c}={v}",
    "r{r} c{c} {v}",
    "{r} {c} {v}",
    '{{"row": {r}, "col": {c}, "value": {v}}}',
    '{{"r":{r},"c":{c},"v":{v}}}',
]


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.data(), st.sampled_from([4, 6, 9]), st.sampled_from(_FORMS), st.text(alphabet="ab .!?", max_size=20)
)
def test_parser_round_trips_every_form(data, size, form, junk):
    r, c, v = (data.draw(st.integers(1, size)) for _ in range(3))
    text = junk + "\n" + form.format(r=r, c=c, v=v) + "\nset 1 1 1"
    assert parse_action(text, size) == (r, c, v)


# ----------------------------------------------------------------------------------- task sets and files


def test_task_sets_reproducible_and_prefix_stable():
    a = make_task_set(7, 6, 8, 10)
    assert a == make_task_set(7, 6, 8, 10)
    assert a[:4] == make_task_set(7, 6, 8, 4)
    assert a != make_task_set(8, 6, 8, 10)
    assert len({t.to_json() for t in a}) == 10
    assert make_task_set(7, 4, 3, 0) == []
    with pytest.raises(ValueError, match="count"):
        make_task_set(7, 4, 3, -1)


def test_jsonl_round_trip(tmp_path):
    tasks = make_task_set(1, 9, 10, 5) + make_task_set(1, 4, 2, 3, unique=True)
    path = tmp_path / "sub" / "tasks.jsonl"
    save_tasks_jsonl(path, tasks)
    assert load_tasks_jsonl(path) == tasks
    assert SudokuTask.from_json(tasks[0].to_json()) == tasks[0]
    with pytest.raises(ValueError, match=r"tasks.jsonl:6: .*size"):
        load_tasks_jsonl(path, size=9)


def test_external_puzzle_formats(tmp_path):
    task = generate_task(np.random.default_rng(0), 9, 30)
    digits = "".join(str(v) for row in task.puzzle for v in row)
    sol = "".join(str(v) for row in task.solution for v in row)
    lines = [
        {"puzzle": digits.replace("0", "."), "solution": sol},
        {"puzzle": digits},
        {"puzzle": task.puzzle, "solution": task.solution, "source": "kaggle"},
    ]
    path = tmp_path / "ext.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    loaded = load_tasks_jsonl(path, size=9)
    assert [t.puzzle for t in loaded] == [task.puzzle] * 3
    assert [t.solution for t in loaded] == [task.solution, None, task.solution]
    assert all(t.h_star == 30 and t.size == 9 for t in loaded)

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"puzzle": digits, "solution": digits.replace("0", "1")}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: solution"):
        load_tasks_jsonl(bad)
    for obj, match in [
        ({"puzzle": "123"}, "16, 36 or 81"),
        ({"puzzle": "11" + "0" * 14}, "conflict"),
        ({"puzzle": "x" * 16}, "characters"),
        ({"solution": sol}, "puzzle"),
        ({"puzzle": digits, "h_star": 3}, "h_star"),
    ]:
        with pytest.raises(ValueError, match=match):
            SudokuTask.from_json(obj)


# ------------------------------------------------------------------------------------------ environment


def run_oracle(env, seed=0, options=None):
    obs, info = env.reset(seed=seed, options=options)
    solution = env.unwrapped.task.solution
    rewards, steps = [], 0
    while True:
        obs, reward, terminated, truncated, info = env.step(oracle_move(env.unwrapped.board, solution))
        rewards.append(reward)
        steps += 1
        if terminated or truncated:
            return steps, rewards, terminated, truncated, info


@pytest.mark.parametrize(
    "size,h_star", [(9, 5), (9, 10), (9, 15), (4, 5), (4, 10), (4, 15), (6, 5), (6, 10), (6, 15)]
)
def test_oracle_policy_solves_in_h_star_turns(size, h_star):
    for seed in range(3):
        env = SudokuEnv(size=size, h_star=h_star)
        steps, rewards, terminated, truncated, info = run_oracle(env, seed)
        assert steps == h_star and terminated and not truncated
        assert info["is_success"] and rewards == [0.0] * (h_star - 1) + [1.0]
        assert info["turn"] == h_star and info["holes_left"] == 0 and info["progress"] == 1.0
        assert info["shaped_reward"] == pytest.approx(1.0)


def test_oracle_shaped_reward_sums_to_one():
    env = SudokuEnv(size=6, h_star=8, reward="shaped")
    steps, rewards, terminated, _, info = run_oracle(env, 4)
    assert terminated and info["is_success"] and sum(rewards) == pytest.approx(1.0)
    assert info["shaped_reward"] == pytest.approx(1.0)


def test_shaped_reward_sum_equals_running_value():
    env = SudokuEnv(size=4, h_star=6, reward="shaped")
    env.reset(seed=2)
    sol = env.task.solution
    wrong = next((r, c) for r in range(4) for c in range(4) if env.board[r][c] == 0)
    actions = ["garbage", f"set {wrong[0] + 1} {wrong[1] + 1} {sol[wrong[0]][wrong[1]] % 4 + 1}", "set 9 9 9"]
    total, info = 0.0, {}
    for a in actions:
        _, reward, terminated, truncated, info = env.step(a)
        total += reward
    assert total == pytest.approx(info["shaped_reward"])
    # one of three moves valid, the written cell clashes (progress 0)
    assert info["shaped_reward"] == pytest.approx(0.2 * 1 / 3)
    # binary mode reports the same shaped value but pays nothing
    env2 = SudokuEnv(size=4, h_star=6)
    env2.reset(seed=2)
    for a in actions:
        _, reward, *_, info2 = env2.step(a)
        assert reward == 0.0
    assert info2["shaped_reward"] == pytest.approx(info["shaped_reward"])


def test_invalid_moves_leave_board_unchanged():
    env = SudokuEnv(size=4, h_star=5)
    obs, info = env.reset(seed=0)
    puzzle = env.task.puzzle
    given = next((r + 1, c + 1) for r in range(4) for c in range(4) if puzzle[r][c])
    empty = next((r + 1, c + 1) for r in range(4) for c in range(4) if not puzzle[r][c])
    _, _, _, _, info = env.step(f"set {empty[0]} {empty[1]} 1")  # valid (maybe clashing): fills the cell
    assert info["action_is_valid"] and env.board[empty[0] - 1][empty[1] - 1] == 1
    cases = [
        (
            f"set {given[0]} {given[1]} 1",
            f"invalid: cell r{given[0]}c{given[1]} is a given",
            f"given r{given[0]}c{given[1]}",
        ),
        (f"set {empty[0]} {empty[1]} 2", "already filled", "filled"),
        ("set 5 1 1", "row 5 out of range", "bad row 5"),
        ("set 1 1 9", "value 9 out of range", "bad val 9"),
        ("¯\\_(ツ)_/¯", "could not parse; use: set r c v", "bad format"),
        ("", "empty", "empty"),
        ("", "empty", "empty"),  # the same invalid move twice still changes the observation
    ]
    prev_obs, turn = env._obs(), 1
    for action, feedback, short in cases:
        board = env.board
        obs, reward, terminated, truncated, info = env.step(action)
        turn += 1
        assert env.board == board and obs != prev_obs and reward == 0.0
        assert not info["action_is_valid"] and info["turn"] == turn and feedback in info["feedback"]
        assert obs.splitlines()[-1].startswith(short) and obs.endswith(f" t{15 - turn}")
        assert not (terminated or truncated)
        prev_obs = obs


def test_turn_cap_truncates_and_done_env_refuses_steps():
    env = SudokuEnv(size=4, h_star=2, turn_cap_factor=3)
    env.reset(seed=1)
    for t in range(1, 7):
        _, _, terminated, truncated, info = env.step("nope")
        assert not terminated and truncated == (t == 6) and info["turns_left"] == 6 - t
    assert not info["is_success"] and info["holes_left"] == 2
    with pytest.raises(RuntimeError, match="reset"):
        env.step("set 1 1 1")
    with pytest.raises(RuntimeError, match="reset"):
        SudokuEnv(size=4).step("set 1 1 1")


def test_wrong_full_board_terminates_without_success():
    env = SudokuEnv(size=4, h_star=2)
    env.reset(seed=5)
    (r1, c1), (r2, c2) = [(r, c) for r in range(4) for c in range(4) if env.board[r][c] == 0]
    sol = env.task.solution
    env.step(f"set {r1 + 1} {c1 + 1} {sol[r1][c1] % 4 + 1}")
    obs, reward, terminated, truncated, info = env.step(f"set {r2 + 1} {c2 + 1} {sol[r2][c2]}")
    assert terminated and not truncated and reward == 0.0 and not info["is_success"]
    assert obs.endswith("wrong t4")


def test_clash_feedback_and_overwrite():
    puzzle = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 0, 0]]
    env = SudokuEnv(size=4, h_star=1, allow_overwrite=True)
    obs, info = env.reset(options={"puzzle": puzzle})
    assert info["h_star"] == 2 and info["turn_cap"] == 6 and obs == "1 1234\n2 3412\n3 2143\n4 43..\nnew t6"
    _, _, _, _, info = env.step("set 4 3 4")
    assert info["action_is_valid"] and info["feedback"] == "ok: r4c3=4 clashes with r4c1"
    _, _, _, _, info = env.step("set 4 3 2")  # overwrite a written cell
    assert info["action_is_valid"] and info["feedback"] == "ok: r4c3=2" and info["progress"] == 0.5
    _, _, _, _, info = env.step("set 4 1 1")  # givens are never overwritable
    assert not info["action_is_valid"] and "given" in info["feedback"]
    obs, reward, terminated, _, info = env.step("set 4 4 1")
    assert terminated and reward == 1.0 and info["is_success"] and obs.endswith("solved t2")


def test_external_task_via_options_and_alternative_solutions():
    # two completions exist; the validator (not the stored solution) judges success
    puzzle = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
    for r, c in [(0, 0), (0, 1), (2, 0), (2, 1)]:
        puzzle[r][c] = 0
    task = SudokuTask(puzzle=puzzle, solution=None, size=4, h_star=4)
    env = SudokuEnv(size=4, h_star=9)
    _, info = env.reset(seed=0, options={"task": task})
    assert info["h_star"] == 4 and info["turns_left"] == 12
    assert count_solutions(puzzle, 4) == 2
    for move in ["set 1 1 2", "set 1 2 1", "set 3 1 1", "set 3 2 2"]:  # not the original grid
        _, reward, terminated, _, info = env.step(move)
    assert terminated and reward == 1.0 and info["is_success"]
    with pytest.raises(ValueError, match="size"):
        env.reset(options={"task": generate_task(np.random.default_rng(0), 6, 3)})
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"hstar": 3})
    _, info = env.reset(seed=0, options={"h_star": 7})
    assert info["h_star"] == 7 and info["turn_cap"] == 21


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"size": 5}, "size"),
        ({"size": 4, "h_star": 17}, "h_star"),
        ({"h_star": 0}, "h_star"),
        ({"turn_cap_factor": 0.5}, "turn_cap_factor"),
        ({"reward": "dense"}, "reward"),
        ({"render_mode": "human"}, "render_mode"),
    ],
)
def test_env_validates_args(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must"):
        SudokuEnv(**kwargs)


@pytest.mark.parametrize("size", [4, 6, 9])
def test_observation_format_and_bounds(size):
    env = SudokuEnv(size=size, h_star=min(15, size * size), render_mode="ansi")
    obs, _ = env.reset(seed=0)
    lines = obs.splitlines()
    assert len(lines) == size + 1 and obs.isascii() and obs == env.render()
    for r, line in enumerate(lines[:-1]):
        assert line[:2] == f"{r + 1} " and len(line) == size + 2
        assert [0 if ch == "." else int(ch) for ch in line[2:]] == env.board[r]
    assert lines[-1] == f"new t{env.turn_cap}"
    # worst case status line still fits the space
    obs, *_ = env.step("set 1 1 123456")
    assert obs in env.observation_space and obs.splitlines()[-1] == f"bad val >999 t{env.turn_cap - 1}"
    if size == 4:
        assert len(obs) <= 45
    assert "set r c v" in env.instructions and f"1-{size}" in env.instructions and len(env.instructions) < 260


def test_env_uses_no_global_rng():
    random.seed(123)
    np.random.seed(123)
    py_state, np_state = random.getstate(), np.random.get_state()
    env = SudokuEnv(size=9, h_star=10, unique=True)
    run_oracle(env, seed=3)
    make_task_set(0, 6, 5, 3)
    assert random.getstate() == py_state
    now = np.random.get_state()
    assert now[0] == np_state[0] and np.array_equal(now[1], np_state[1]) and now[2:] == np_state[2:]


# --- hint levels -------------------------------------------------------------------------------------------

def _brute_candidates(board, r, c):
    """Digits that appear nowhere else in the cell's row, column and box (a second, direct implementation)."""
    from esopt.envs.sudoku import BOX_SHAPES

    n = len(board)
    br, bc = BOX_SHAPES[n]
    others = [(rr, cc) for rr in range(n) for cc in range(n) if (rr, cc) != (r, c) and
              (rr == r or cc == c or (rr // br == r // br and cc // bc == c // bc))]
    return [d for d in range(1, n + 1) if all(board[rr][cc] != d for rr, cc in others)]


@pytest.mark.parametrize("size", [4, 6, 9])
def test_hint_levels_show_nothing_the_empty_cells_or_their_candidates(size):
    from esopt.envs import make_env

    h = {4: 5, 6: 12, 9: 40}[size]
    plain, empty, cand = (make_env("esopt/Sudoku-v0", size=size, h_star=h, hints=k)
                          for k in ("none", "empty", "candidates"))
    o_plain, o_empty, o_cand = (e.reset(seed=3)[0] for e in (plain, empty, cand))
    assert "empty:" not in o_plain
    board = cand.unwrapped.board
    holes = [(r, c) for r in range(size) for c in range(size) if not board[r][c]]
    assert o_empty.splitlines()[-2] == "empty: " + ", ".join(f"{r + 1} {c + 1}" for r, c in holes)
    entries = o_cand.splitlines()[-2].removeprefix("empty: ").split(", ")
    solution = cand.unwrapped.task.solution
    for (r, c), entry in zip(holes, entries, strict=True):
        cell, digits = entry.split(" [")
        assert cell == f"{r + 1} {c + 1}"
        listed = [int(d) for d in digits.rstrip("]").split()]
        assert listed == _brute_candidates(board, r, c) and solution[r][c] in listed
    for env, obs in ((plain, o_plain), (empty, o_empty), (cand, o_cand)):
        assert env.observation_space.contains(obs)


def test_candidates_follow_the_board_and_old_show_empty_means_hints_empty():
    from esopt.envs import make_env

    env = make_env("esopt/Sudoku-v0", size=4, h_star=6, hints="candidates")
    env.reset(seed=0)
    board = env.unwrapped.board
    (r, c), (r2, c2) = [(r, c) for r in range(4) for c in range(4) if not board[r][c]][:2]
    wrong = next(d for d in range(1, 5) if d != env.unwrapped.task.solution[r][c])
    obs, *_ = env.step(f"set {r + 1} {c + 1} {wrong}")  # a written digit counts for its neighbours
    board = env.unwrapped.board
    entries = obs.splitlines()[-2].removeprefix("empty: ").split(", ")
    entry = next(e for e in entries if e.startswith(f"{r2 + 1} {c2 + 1} "))
    assert entry.split(" [")[1].rstrip("]").split() == [str(d) for d in _brute_candidates(board, r2, c2)]
    old = make_env("esopt/Sudoku-v0", size=4, h_star=3, show_empty=True)
    new = make_env("esopt/Sudoku-v0", size=4, h_star=3, hints="empty")
    assert old.reset(seed=5)[0] == new.reset(seed=5)[0]
    with pytest.raises(ValueError, match="hints must be one of"):
        make_env("esopt/Sudoku-v0", size=4, h_star=3, hints="all")


def test_a_tiny_model_rollout_sees_the_candidates_in_every_prompt(policy):
    from esopt.engines.base import SamplingParams
    from esopt.envs import make_env
    from esopt.rollout import RolloutSpec

    spec = RolloutSpec(sampling=SamplingParams(temperature=0, max_new_tokens=6))
    trajs, _ = spec.run(policy, lambda: make_env("esopt/Sudoku-v0", size=4, h_star=2, hints="candidates"),
                        [1, 2, 3], seed=0)
    turns = [t for traj in trajs for t in traj.turns]
    assert turns and all("empty: " in t.observation and " [" in t.observation for t in turns)


@pytest.mark.parametrize("hints", ["none", "candidates"])
def test_episode_worked_examples_replay_a_solved_episode(hints):
    env = SudokuEnv(size=4, h_star=3, hints=hints, examples="episode")
    pairs = env.worked_examples(2, seed=5)
    assert len(pairs) == 2 * 3  # every exchange of two solved three-move episodes
    for start in (0, 3):
        replay = SudokuEnv(size=4, h_star=3, hints=hints)
        episode = pairs[start:start + 3]
        rows = episode[0][0].splitlines()[:4]
        first_board = [[int(ch) if ch != "." else 0 for ch in line.split()[1]] for line in rows]
        solution = [row[:] for row in first_board]
        for _, move in episode:  # the moves fill the holes with the solution's digits
            _, r, c, v = move.split()
            solution[int(r) - 1][int(c) - 1] = int(v)
        assert all(v for row in solution for v in row) and len({m for _, m in episode}) == 3
        obs, _ = replay.reset(options={"puzzle": first_board, "solution": solution})
        for shown, move in episode:
            assert shown.rsplit(" t", 1)[0] == obs.rsplit(" t", 1)[0]  # same board, hints and feedback
            obs, _, terminated, _, info = replay.step(move)
            assert info["action_is_valid"] and info["action_is_correct"]
        assert terminated and info["is_success"]


def test_first_move_worked_examples_are_one_pair_per_puzzle():
    pairs = SudokuEnv(size=4, h_star=3).worked_examples(3, seed=5)
    assert len(pairs) == 3 and len({obs for obs, _ in pairs}) == 3
    with pytest.raises(ValueError, match="examples must be one of"):
        SudokuEnv(size=4, examples="all")
