"""`esopt/MiniWoB-v0`: real MiniWoB++ task pages in Debian's headless Chromium, read through BrowserGym's
accessibility tree. The scripted oracle solves every default task and wrong actions score 0; malformed replies
cost a turn; seeds fix the instance; the env keeps the agent-env contract; a process's envs share one Chromium,
each in a context of its own; Chromium is gone after the last `close()` and after its parent process is
SIGKILLed, and launched again when it dies; fuzzed replies never crash it.

Runs where `make` installed the `web-browser` extra (miniwob, browsergym-miniwob, playwright) and Debian's
chromium-headless-shell; skipped elsewhere. One env serves the module; the shared Chromium it holds serves the
envs other tests open besides."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

pytest.importorskip("playwright.sync_api")
pytest.importorskip("browsergym.miniwob")
from gymnasium.utils.env_checker import check_env as gymnasium_check_env  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from esopt.envs import MINIWOB_ID, check_env, make_env  # noqa: E402
from esopt.envs.web.actions import Action, ParseError, parse_action  # noqa: E402
from esopt.envs.web.miniwob import (  # noqa: E402
    DEFAULT_TASKS,
    MiniWoBEnv,
    MiniWoBUnavailable,
    missing_requirement,
    oracle_actions,
    page_elements,
    task_classes,
)

MISSING = missing_requirement()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
REPO = Path(__file__).resolve().parents[2]


def browser_processes(root: int | None = None) -> list[psutil.Process]:
    """Chromium and playwright's node driver under `root` (this process by default)."""
    found = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if any(k in p.name().lower() for k in ("chrom", "node")):
                found.append(p)
        except psutil.NoSuchProcess:  # a renderer that just exited
            pass
    return found


def chromium_browsers(root: int | None = None) -> list[psutil.Process]:
    """Chromium's browser processes under `root`: those playwright's node drivers launched (not their renderers,
    GPU or utility processes)."""
    found = []
    for p in browser_processes(root):
        try:
            if "node" in p.name().lower():
                found += [c for c in p.children() if "chrom" in c.name().lower()]
        except psutil.NoSuchProcess:
            pass
    return found


def launches() -> int:
    """How many times this process launched a shared Chromium."""
    from esopt.envs.web import miniwob

    return sum(shared.launches for shared in miniwob._SHARED.values())


@pytest.fixture(scope="module")
def env():
    env = MiniWoBEnv()
    env.reset(seed=0)
    assert any("chrom" in p.name().lower() for p in browser_processes())
    yield env
    running = browser_processes()  # its Chromium may have been restarted (the crash test)
    env.close()
    _, alive = psutil.wait_procs(running, timeout=15)  # returns as soon as all have exited
    assert not alive


def play(env, actions):
    out = None
    for action in actions:
        out = env.step(action)
    return out


def test_default_tasks_ship_with_the_wheel():
    assert len(DEFAULT_TASKS) == 10 and set(DEFAULT_TASKS) <= set(task_classes())


@pytest.mark.parametrize("task", DEFAULT_TASKS)
def test_oracle_solves_each_default_task(env, task):
    for seed in (1, 2**31 + 1):  # a training and a test instance
        obs, info = env.reset(seed=seed, options={"task": task})
        assert info["task"] == task and obs.startswith("Goal: ") and "[" in obs
        plan = oracle_actions(task, obs)
        for k, action in enumerate(plan):
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["action_is_valid"] and info["feedback"] == "ok", (action, info)
            assert terminated == (k == len(plan) - 1) and not truncated, (task, seed, action)
        assert reward == 1.0 and info["is_success"] and info["action_is_correct"], (task, seed, obs)
        assert info["shaped_reward"] == 1.0 and info["raw_reward"] > 0
        assert obs.endswith("The episode is over.")


def wrong_actions(task: str, obs: str) -> list[str]:
    """Replies that end `task` unsolved: the wrong target, the wrong text, the wrong order."""
    els = page_elements(obs)
    quoted = re.findall(r'"([^"]*)"', obs.split("\n", 1)[0])
    bids = {role: [b for b, r, _ in els if r == role] for role in ("button", "textbox", "combobox")}
    submit = next((f'click("{b}")' for b, role, name in els if role == "button" and name in ("Submit", "Login")), "")
    if task == "click-button":
        return [next(f'click("{b}")' for b, role, name in els if role == "button" and name != quoted[0])]
    if task == "click-button-sequence":
        return oracle_actions(task, obs)[::-1]
    if task == "enter-text":
        return [f'fill("{bids["textbox"][0]}", "x{quoted[0]}")', submit]
    if task == "choose-list":
        target = re.search(r"Select (.*) from the list", obs)[1]
        other = next(name for _, role, name in els if role == "option" and name != target)
        return [f'select_option("{bids["combobox"][0]}", {other!r})', submit]
    if task == "login-user":  # username and password swapped
        user, password = bids["textbox"]
        return [f'fill("{user}", {quoted[1]!r})', f'fill("{password}", {quoted[0]!r})', submit]
    raise AssertionError(task)


@pytest.mark.parametrize("task", ["click-button", "click-button-sequence", "enter-text", "choose-list", "login-user"])
def test_wrong_actions_score_zero(env, task):
    obs, _ = env.reset(seed=5, options={"task": task})
    obs, reward, terminated, truncated, info = play(env, wrong_actions(task, obs))
    assert terminated and not truncated and reward == 0.0 and not info["is_success"], obs
    assert info["shaped_reward"] == 0.0 and info["raw_reward"] < 0 and not info["action_is_correct"]


def test_malformed_replies_cost_a_turn_with_feedback(env):
    env.max_turns = 4
    try:
        env.reset(seed=3, options={"task": "enter-text"})
        replies = ["I would click the button", 'click("14"', "fill('14')", 'click("999")']
        for k, reply in enumerate(replies):
            obs, reward, terminated, truncated, info = env.step(reply)
            assert reward == 0.0 and not terminated and truncated == (k == 3)
            assert "Error: " in obs and info["feedback"] in obs
            assert info["action_is_valid"] == (k == 3)  # a valid call on an unknown bid: the browser says why
            assert ("invalid action" in info["feedback"]) == (k < 3)
        assert "Could not find element" in info["feedback"] and obs.endswith("The episode is over.")
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step('click("15")')
    finally:
        env.max_turns = 10
    env.reset(seed=3, options={"task": "enter-text"})
    obs, _, terminated, _, info = env.step('goto("file:///etc/passwd")')
    assert info["action_is_valid"] and "does nothing here" in info["feedback"] and not terminated
    assert "root:" not in obs


def test_same_seed_same_instance_and_seeds_spread_tasks(env):
    a, info_a = env.reset(seed=7)
    env.reset(seed=8)
    b, info_b = env.reset(seed=7)
    assert a == b and info_a == info_b
    seeds = (0, 1, 2, 2**31, 2**31 + 2**30)  # training, test and validation seeds
    goals = {env.reset(seed=s, options={"task": "enter-text"})[0].split("\n")[0] for s in seeds}
    assert len(goals) >= 4  # instance-randomised
    drawn = {env.reset(seed=s)[1]["task"] for s in range(16)}
    assert len(drawn) >= 5 and drawn <= set(DEFAULT_TASKS)


def test_env_steps_from_any_thread(env):
    obs, _ = env.reset(seed=2, options={"task": "enter-text"})
    with ThreadPoolExecutor(2) as pool:  # as the rollout engine steps `concurrent_steps` envs
        for action in oracle_actions("enter-text", obs):
            reward = pool.submit(env.step, action).result()[1]
    assert reward == 1.0


def test_a_crashed_page_ends_the_episode_and_the_next_reset_recovers(env):
    obs, _ = env.reset(seed=4, options={"task": "enter-text"})
    env.session.call_timeout = 5  # a call the crash leaves hanging is cut short sooner than in training
    renderers = [p for p in browser_processes() if "--type=renderer" in p.cmdline()]
    for renderer in renderers:
        renderer.kill()
    psutil.wait_procs(renderers, timeout=5)
    obs, reward, terminated, _, info = env.step(oracle_actions("enter-text", obs)[0])
    assert terminated and reward == 0.0 and "episode is over" in info["feedback"], info
    obs, _ = env.reset(seed=4, options={"task": "enter-text"})
    assert play(env, oracle_actions("enter-text", obs))[1] == 1.0


def test_observation_is_capped_ascii(env):
    env.page_chars = 200
    try:
        obs, _ = env.reset(seed=1, options={"task": "click-checkboxes"})
    finally:
        env.page_chars = 1500
    tree = obs.split("\n", 1)[1]
    assert len(tree) <= 200 + len("\n(the rest of the page is cut)") and obs.isascii()
    assert "url=" not in obs and "InlineTextBox" not in obs


def test_agent_env_contract_and_gymnasium_checker(env):
    check_env(env)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gymnasium_check_env(env, skip_render_check=True)


def test_missing_chromium_or_task_is_a_one_line_error():
    with pytest.raises(MiniWoBUnavailable, match="no Chromium at '/nonexistent/chrome'"):
        MiniWoBEnv(chromium="/nonexistent/chrome")
    with pytest.raises(ValueError, match="unknown MiniWoB task 'nope'"):
        make_env(MINIWOB_ID, tasks=["nope"])


def test_processes_gone_after_close():
    before = {p.pid for p in browser_processes()}  # the shared env's, if it is up
    env = make_env(MINIWOB_ID, tasks=["click-test"])
    env.reset(seed=0)
    started = [p for p in browser_processes() if p.pid not in before]
    assert any("chrom" in p.name().lower() for p in started)
    env.close()
    env.close()  # twice is fine
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive


def test_envs_share_one_chromium_each_in_a_context_of_its_own(env):
    env.reset(seed=0)  # the module's env holds the shared Chromium: the others join it
    before = launches()
    envs = [MiniWoBEnv(tasks=["enter-text"]) for _ in range(2)] + [MiniWoBEnv(tasks=["click-checkboxes"])]
    try:
        first = [e.reset(seed=s)[0] for e, s in zip(envs, (1, 3, 1))]
        assert launches() == before and len(chromium_browsers()) == 1
        assert len([p for p in browser_processes() if "node" in p.name()]) == 1
        sessions = [e.session for e in (env, *envs)]
        assert len({id(s.chromium) for s in sessions}) == 1 and len({id(s.context) for s in sessions}) == 4
        # each page is its own instance: the one an env alone would get for that task and seed
        assert first[0] != first[1] and first[0].startswith("Goal: Enter") and first[2].startswith("Goal: Select")
        assert env.reset(seed=1, options={"task": "enter-text"})[0] == first[0]
        assert env.reset(seed=1, options={"task": "click-checkboxes"})[0] == first[2]
        # stepped from threads at once, as the rollout engine steps them; one's page leaves the others' alone
        plans = [oracle_actions(e.task_name, o) for e, o in zip(envs, first)]
        with ThreadPoolExecutor(len(envs)) as pool:
            ends = list(pool.map(play, envs, plans))
        assert [end[1] for end in ends] == [1.0, 1.0, 1.0], [end[0] for end in ends]
    finally:
        for e in envs:
            e.close()
    assert env.session.chromium.alive() and env.reset(seed=1, options={"task": "enter-text"})[0] == first[0]


@pytest.mark.parametrize("how", ["kill", "close"])
def test_a_dead_chromium_is_launched_again_on_the_next_reset(env, how):
    fresh = env.reset(seed=6, options={"task": "enter-text"})
    other = MiniWoBEnv(tasks=["click-test"])
    try:
        other.reset(seed=0)
        dead, before = env.session.chromium, launches()
        if how == "kill":  # Chromium crashed, or was killed
            for p in dead.launched:
                p.kill()
            psutil.wait_procs(dead.launched, timeout=10)
        else:  # closed under the envs
            dead.run(dead.browser.close)
        obs, reward, terminated, _, info = env.step(oracle_actions("enter-text", fresh[0])[0])
        assert terminated and reward == 0.0 and "episode is over" in info["feedback"], info  # ended, unsolved
        assert env.reset(seed=6, options={"task": "enter-text"}) == fresh  # a fresh Chromium: the same instance
        assert play(other, oracle_actions("click-test", other.reset(seed=0)[0]))[1] == 1.0
        assert launches() == before + 1 and env.session.chromium is other.session.chromium is not dead
        assert len(chromium_browsers()) == 1 and not dead.thread.is_alive()
        assert play(env, oracle_actions("enter-text", fresh[0]))[1] == 1.0
    finally:
        other.close()


CHILD = """
import json, sys
from esopt.envs.web import miniwob
envs = [miniwob.MiniWoBEnv(tasks=["enter-text"]) for _ in range(int(sys.argv[1]))]
goals = [env.reset(seed=2 * k + 1)[0].split("\\n")[0] for k, env in enumerate(envs)]
print(json.dumps({"launches": sum(s.launches for s in miniwob._SHARED.values()), "goals": goals}), flush=True)
for env in envs:  # one env closed for each line read
    sys.stdin.readline()
    env.close()
    print("closed", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def child_with_envs(envs: int) -> Iterator[tuple[subprocess.Popen, dict]]:
    """A Python process with `envs` MiniWoB envs reset (on seeds 1, 3, 5, ...), and what it printed then."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(envs)], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    watchdog = threading.Timer(90, child.kill)  # a hung child cannot hang the suite
    watchdog.start()
    try:
        yield child, json.loads(child.stdout.readline() or "{}")
    finally:
        watchdog.cancel()
        child.kill()
        child.wait(timeout=10)


def test_the_last_close_takes_the_shared_chromium_down():
    with child_with_envs(3) as (child, report):
        assert report["launches"] == 1 and len(set(report["goals"])) == 3  # three envs, three pages, one launch
        spawned = browser_processes(child.pid)
        browsers = chromium_browsers(child.pid)
        assert len(browsers) == 1 and len([p for p in spawned if "node" in p.name()]) == 1
        for left in (2, 1, 0):
            child.stdin.write("\n")  # the child closes one env
            child.stdin.flush()
            assert child.stdout.readline().strip() == "closed"
            if left:  # Chromium stays while an env still uses it
                assert chromium_browsers(child.pid) == browsers, left
        _, alive = psutil.wait_procs(spawned, timeout=10)  # the child lives on: its last close() ended them
        assert not alive and child.poll() is None, [(p.pid, p.name()) for p in alive]


def test_chromium_dies_with_its_parent_on_sigkill():
    survivors: list[psutil.Process] = []
    with child_with_envs(2) as (child, report):  # two envs: one driver, one Chromium
        assert report["launches"] == 1
        spawned = browser_processes(child.pid)
        assert any("chrom" in p.name().lower() for p in spawned) and any("node" in p.name() for p in spawned)
        try:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
            _, survivors = psutil.wait_procs(spawned, timeout=10)
            assert not survivors, [(p.pid, p.name()) for p in survivors]
        finally:
            for p in survivors:
                p.kill()


FRAGMENTS = st.sampled_from([
    "click(", "fill(", "select_option(", "press(", "focus(", "clear(", "scroll(", "noop(", "check(", "hover(",
    "dblclick(", "goto(", "go_back(", "send_msg_to_user(", '"', "'", "12", "14", "15", "-1", "1e309", ", ", ")",
    "[", "]", "\n", "```", " ", "None", 'button="right"', "button=3", 'modifiers=["Shift"]', "modifiers=[1]",
    '"Enter"', '"ArrowDown+Nope"', "(", "lambda: 0", '__import__("os").system("true")', "nan", "**", "\x00",
])
REPLIES = st.one_of(st.text(max_size=40), st.lists(FRAGMENTS, max_size=10).map("".join))


@settings(max_examples=200, deadline=None)
@given(reply=REPLIES)
def test_parser_returns_an_action_or_a_reason(reply):
    got = parse_action(reply)
    assert isinstance(got, (Action, ParseError))


@settings(max_examples=15, deadline=None)
@given(replies=st.lists(REPLIES, min_size=1, max_size=4))
def test_fuzzed_replies_never_crash_the_env(env, replies):
    obs, _ = env.reset(seed=len(replies), options={"task": "login-user"})
    for reply in replies:
        obs, reward, terminated, truncated, info = env.step(reply)
        assert obs in env.observation_space and reward in (0.0, 1.0) and isinstance(info["feedback"], str)
        if terminated or truncated:
            break


def test_worked_examples_are_oracle_turns_round_robin_over_the_tasks(env):
    from esopt.envs.web import miniwob

    miniwob._EXAMPLES.clear()
    turns = env.example_turns(20)  # two rounds over the ten default tasks
    assert [(e.observation, e.reply) for e in turns] == env.worked_examples(20)
    assert {e.task for e in turns[:10]} == set(DEFAULT_TASKS) and all(e.turn == 0 for e in turns[:10])
    assert [e.task for e in turns[:2]] == ["click-test", "choose-list"]  # a click, then a new kind of action
    assert len({e.action for e in turns[:4]}) == 4  # click, select_option, focus, fill
    for e in turns:
        action = parse_action(e.reply)
        assert isinstance(action, Action) and e.reply == miniwob.canonical_call(e.reply), e.reply
        assert e.observation.startswith("Goal: ") and len(e.observation) < 600 and "Error" not in e.observation
        assert action == parse_action(oracle_actions(e.task, e.observation)[e.turn]), e  # the oracle's reply there
    later = {e.task: e for e in turns[10:]}  # the second round: second turns (one-step tasks: first turns again)
    assert {e.task for e in turns[10:]} == set(DEFAULT_TASKS) and later["click-test"].turn == 0
    assert later["enter-text"].turn == 1 and "value=" in later["enter-text"].observation
    assert later["enter-text"].reply.startswith("click(")  # the Submit button, once the text is in
    assert env.worked_examples(2) == [(e.observation, e.reply) for e in turns[:2]]
    miniwob._EXAMPLES.clear()  # built again from scratch: the same examples
    assert env.example_turns(20) == turns
    assert env.worked_examples(2, seed=1) != env.worked_examples(2)


def test_worked_examples_leave_the_episode_and_the_next_reset_alone(env):
    from esopt.envs.web import miniwob

    fresh, info = env.reset(seed=11, options={"task": "enter-text"})
    plan = oracle_actions("enter-text", fresh)
    middle = env.step(plan[0])[0]
    state = env.np_random.bit_generator.state
    miniwob._EXAMPLES.clear()
    assert len(env.worked_examples(3, seed=5)) == 3  # played in a scratch context of the env's Chromium
    assert env.np_random.bit_generator.state == state and env.last_observation == middle
    chromium = env.session.chromium  # the examples' context is gone: the env's own is the only one left
    assert chromium.run(lambda: [len(c.pages) for c in chromium.browser.contexts]) == [1]
    _, reward, terminated, _, _ = env.step(plan[1])  # the episode goes on where it was
    assert terminated and reward == 1.0
    assert env.reset(seed=11, options={"task": "enter-text"}) == (fresh, info)
    again = env.reset(seed=12)
    miniwob._EXAMPLES.clear()
    env.worked_examples(2, seed=6)
    assert env.reset(seed=12) == again


def test_worked_examples_of_tasks_without_an_oracle(env):
    spare = [t for t in task_classes() if t not in DEFAULT_TASKS][0]
    tasks = env.tasks
    env.tasks = [spare, "focus-text"]
    try:
        assert [e.task for e in env.example_turns(2, seed=9)] == ["focus-text", "focus-text"]
        env.tasks = [spare]
        with pytest.raises(NotImplementedError, match="no worked examples"):
            env.worked_examples(1, seed=9)
    finally:
        env.tasks = tasks
