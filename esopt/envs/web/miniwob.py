"""`esopt/MiniWoB-v0`: real MiniWoB++ tasks in a headless Chromium, read as BrowserGym's accessibility tree.

## Description
The agent solves MiniWoB++ tasks (Liu et al. 2018; the `miniwob` package's task pages): "Click on the "submit"
button", "Select Gh and click Submit", "Enter the username "kenda" and the password "Ttlh" into the text fields
and press login". Each episode is one task page set up the way `browsergym-miniwob` does it (its task classes: the
goal and the reward display taken off the page, `Math.seedrandom`, `core.startEpisodeReal()`), in a browser context
of the env's own, kept across resets, in the Chromium (Debian's `chromium-headless-shell`) that the process's envs
share, driven with playwright. The seed picks the task from `tasks` and MiniWoB's own seed, so the same seed gives
the same task instance. There are no per-split tasks: MiniWoB tasks are randomised per instance, so esopt's seed
ranges are the splits (training seeds < 2^31, test seeds [2^31, 2^31 + 2^30), validation seeds above draw
independent instances; tasks with few instances, click-test has one, repeat across them).

## Action
Text: one BrowserGym call, e.g. `click("12")`, `fill("14", "text")`, `select_option("7", "Deonne")`,
`check("5")`, `press("14", "Enter")`, `focus("12")`, `clear("14")`, `hover("3")`, `dblclick("3")`,
`scroll(0, 100)`, `noop()`, read from the reply with `esopt.envs.web.actions` (`ast`, never `eval`); thoughts
around it are allowed. A reply with no valid call costs a turn, leaves the page alone, and the next observation
says why. `goto`, `go_back`, `go_forward`, `send_msg_to_user` and `report_infeasible` parse but do nothing here
(one page, no chat): the observation says so.

## Observation
The goal (MiniWoB's utterance), the last action's error if any, and the page's accessibility tree flattened as
BrowserGym prints it (`[bid] role 'name'`, one space per level; the roles LineBreak and InlineTextBox and the
root's url dropped), at most `page_chars` characters of tree. Printable ASCII.

## Starting state
The task page freshly loaded in the env's browser context (a 332x214 viewport, as in BrowserGym), its problem
generated.

## Rewards
1 when the task's episode ends with a positive raw reward (`WOB_RAW_REWARD_GLOBAL > 0`, BrowserGym's MiniWoB
success; MiniWoB's time discount is ignored), else 0. `info["shaped_reward"]`: the same 0 or 1, and
`info["raw_reward"]` MiniWoB's raw reward in [-1, 1].

## Episode end
Terminated when the task sets its done flag (`WOB_DONE_GLOBAL`: a submit, a click on a target; a wrong one ends
it too, with reward 0) or the page leaves the task's URL; truncated after `max_turns` replies.

## Arguments
`tasks` (MiniWoB task names, default `DEFAULT_TASKS`: ten that read well as text), `max_turns` (10),
`page_chars` (1500), `headless` (True), `chromium` (the browser binary; default Debian's chromium-headless-shell,
or chromium when not headless), `render_mode` (None or "ansi").

## Worked examples
`worked_examples(count, seed)`: (observation, reply) turns of the scripted oracle (`oracle_actions`), the reply
just the action call (`click("13")`, `fill("14", "Thaddeus")`). Example k of a round is one turn of one task, round
robin over `tasks` (those the oracle covers): in each round every task gives one fresh instance and one turn of its
solution (round r: turn r mod the solution's length, so round 0 shows first turns), the tasks whose action kind
(click, fill, ...) is new to the round first, then the rest in `tasks` order; so 2 examples of the default tasks
are a click and a select_option. Instances are no env seed's: browsergym's task seed is drawn from a stream of
their own (`[seed, EXAMPLE_STREAM, crc32(task), round]`, where reset draws from `[env seed, 47]`); as MiniWoB keys
an instance by one of 10^6 `Math.seedrandom` values (and tasks like click-test have one), an episode can still
meet an identical page by chance. The turns are played in a browser context of their own in the shared Chromium
(launched if need be), closed afterwards: the episode's page, its state and the env's RNG are left alone. Built
once per process for each (tasks, page_chars, seed).

## Processes
One playwright driver and one Chromium (Debian's binary, launched by playwright with `executable_path`) per process
(per binary and mode, if envs ask for several), shared by its MiniWoB envs: launched on the first reset of the first
env, closed when the last env is closed (`close()`, or garbage collection). Each env has a browser context of its
own in it (its own page, cookies, storage and renderer), opened on its first reset, reused by every reset (the task
page is loaded again) and closed by `close()`. Playwright's sync API only runs in the thread that started it, so a
daemon thread runs the driver, and each env's calls, made from any thread (the rollout engine steps envs in threads:
`concurrent_steps`), run in there, each in a greenlet of its own on playwright's dispatcher: while one env waits on
its page, the others' calls go on. When the Python process dies, even by SIGKILL, playwright's node driver sees its
stdin close and takes Chromium down with it within a second or two (tests/envs/test_miniwob.py checks this), so
Chromium needs no death signal or watchdog of its own. A crashed page ends its episode unsolved; a call that hangs
(playwright can wait forever on a dead renderer) is cut after `CALL_TIMEOUT_S` by closing the env's context
(Chromium is killed if even that hangs); a Chromium found dead (crashed, killed, closed) ends the episodes in it
unsolved, and the next reset launches another, which the other envs move to on their next reset.

Needs the `web-browser` extra (miniwob, browsergym-miniwob, playwright) and Chromium, both installed by `make`.

## Versions
v0: first version.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import re
import shutil
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from esopt.envs.base import AgentEnv
from esopt.envs.text_space import FreeText, ascii_text_space
from esopt.envs.tools.react import printable
from esopt.envs.web.actions import Action, ParseError, parse_action

DEFAULT_TASKS = (
    "click-test",
    "click-button",
    "click-button-sequence",
    "click-dialog",
    "click-checkboxes",
    "click-option",
    "choose-list",
    "focus-text",
    "enter-text",
    "login-user",
)
# Debian's binary before its /usr/bin shell wrapper (which would stay between playwright and Chromium)
HEADLESS_CHROMIUM = ("/usr/lib/chromium/chromium-headless-shell", "chromium-headless-shell")
WINDOWED_CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
VIEWPORT = {"width": 332, "height": 214}  # BrowserGym's MiniWoB viewport
TIMEOUT_MS, ACTION_TIMEOUT_MS = 5000, 500  # playwright's default timeout (BrowserGym's MiniWoB value), per action
START_TIMEOUT_S, CALL_TIMEOUT_S = 120, 60  # then Chromium is taken as hung: killed, and a fresh one started
SETTLE_MS = 50  # after an action, before reading the page: lets the task's event handlers run
MAX_NOOP_MS, MAX_SCROLL = 1000, 5000
EXAMPLE_STREAM = 0xE8A  # the worked examples' instances: a seed stream reset never draws from (it uses 47)
IGNORED_ROLES = ["LineBreak", "InlineTextBox"]  # Chromium 150+ adds InlineTextBox nodes under every text
NOT_HERE = ("goto", "go_back", "go_forward", "send_msg_to_user", "report_infeasible")
BUTTONS, MODIFIERS = ("left", "middle", "right"), ("Alt", "Control", "ControlOrMeta", "Meta", "Shift")
ACTIONS_HELP = (
    'click("bid"), fill("bid", "text"), select_option("bid", "option"), check("bid"), uncheck("bid"), '
    'press("bid", "Enter"), focus("bid"), clear("bid"), hover("bid"), dblclick("bid"), scroll(0, 100), noop()'
)
INSTRUCTIONS = f"""You are a web agent solving small tasks on a web page. Each turn you see the goal and the page's \
accessibility tree: one element a line as [bid] role 'name'. Reply with one action, e.g.: {ACTIONS_HELP}. Use the \
bid in brackets to name an element. The episode ends when the task is done (a submit or a click on the target \
ends it, right or wrong)."""
INSTALL_HINT = "install the web-browser extra and Chromium: `make` does both"


class ChromiumGone(RuntimeError):
    """The env's Chromium, or playwright's driver of it, died."""


class MiniWoBUnavailable(ValueError):
    """The `web-browser` extra or Chromium is missing (a ValueError: the CLI prints it as one line)."""


def find_chromium(headless: bool = True) -> str | None:
    """Debian's Chromium binary (headless shell when headless), or None."""
    for name in HEADLESS_CHROMIUM if headless else WINDOWED_CHROMIUM:
        found = name if Path(name).is_absolute() and Path(name).exists() else shutil.which(name)
        if found:
            return found
    return None


def miniwob_html_dir() -> Path | None:
    """The task pages shipped in the `miniwob` wheel (found without importing it: that registers its own envs)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "html" / "miniwob"
    return folder if folder.is_dir() else None


def missing_requirement(headless: bool = True, chromium: str | None = None) -> str | None:
    """Why `MiniWoBEnv` cannot run here (one line), or None when it can."""
    for module in ("playwright", "browsergym.core", "browsergym.miniwob"):  # looked up, not imported
        try:
            if importlib.util.find_spec(module) is None:
                raise ImportError
        except ImportError:
            return f"esopt/MiniWoB-v0 needs {module.split('.')[0]} (the web-browser extra): {INSTALL_HINT}"
    if miniwob_html_dir() is None:
        return f"esopt/MiniWoB-v0 needs the miniwob package's task pages (the web-browser extra): {INSTALL_HINT}"
    if chromium is not None and not Path(chromium).exists():
        return f"esopt/MiniWoB-v0: no Chromium at {chromium!r}"
    if chromium is None and find_chromium(headless) is None:
        which = "chromium-headless-shell" if headless else "chromium"
        return f"esopt/MiniWoB-v0 needs Debian's {which} (apt-get install {which}; `make` installs it)"
    return None


def task_classes() -> dict[str, type]:
    """browsergym-miniwob's task classes by MiniWoB name (`click-test`, ...), those whose page the wheel ships."""
    from browsergym.miniwob import ALL_MINIWOB_TASKS

    pages = miniwob_html_dir()
    return {c.subdomain: c for c in ALL_MINIWOB_TASKS if pages is not None and (pages / f"{c.subdomain}.html").exists()}


@dataclass(frozen=True)
class PageState:
    """What the env reads after each setup and action: the flattened tree and the task's state."""

    tree: str
    raw_reward: float  # MiniWoB's raw reward in [-1, 1]; -1 when the page left the task
    done: bool
    solved: bool


class _CallTimeout(ChromiumGone):
    """A call got no answer in time."""


class _Chromium:
    """One playwright driver and its Chromium, run by a daemon thread of their own: playwright's sync API only
    runs in the thread that started it, so calls from other threads are handed to it (`run`, `post`). There each
    call runs in a greenlet of its own on playwright's dispatcher, as playwright runs its own event handlers: a
    call waiting on Chromium (a page load, the settle time) lets the others go on, so envs stepped from several
    threads still step concurrently, and a call that hangs holds up only its own env. The calls get sessions and
    tasks, never an env, so an env dropped without `close()` is still garbage."""

    def __init__(self, executable: str, headless: bool) -> None:
        self.playwright = self.browser = None
        self.driver: psutil.Process | None = None  # playwright's node driver
        self.launched: list[psutil.Process] = []  # the driver's children: Chromium's browser process
        self._loop = self._main = None  # playwright's event loop; the thread's main greenlet
        self._lock = threading.RLock()  # an RLock: an env's __del__ (a garbage collection) may post from a post
        self._open = self._stopping = False  # whether calls are taken; whether `close` has been called
        self._pending: set[Future] = set()
        ready: Future = Future()
        self.thread = threading.Thread(target=self._serve, args=(executable, headless, ready), name="esopt-miniwob",
                                       daemon=True)  # daemon: a wedged driver cannot hold up the interpreter's exit
        self.thread.start()
        try:
            ready.result(START_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            self.close()
            raise ChromiumGone(f"Chromium did not start within {START_TIMEOUT_S} s") from None
        except BaseException:
            self.close()
            raise

    def _serve(self, executable: str, headless: bool, ready: Future) -> None:
        from greenlet import greenlet

        try:
            self._start(executable, headless)
            # playwright's private handles (playwright is pinned, by browsergym-core): its loop, the greenlet running it
            self._loop, dispatcher = self.playwright._loop, self.playwright._dispatcher_fiber
        except BaseException as e:  # handed to the constructor
            self._stop()
            ready.set_exception(e)
            return
        self._main = greenlet.getcurrent()
        with self._lock:
            self._open = not self._stopping  # unless the constructor gave up waiting
        ready.set_result(None)
        if self._open:
            dispatcher.switch()  # the loop runs the calls until `close` switches back here, or the driver dies
        with self._lock:
            self._open = False
        if self._stopping:
            self._stop()
        for future in list(self._pending):  # calls left unanswered (the driver died, or Chromium closed under them)
            try:
                future.set_exception(ChromiumGone("playwright's driver process is gone"))
            except concurrent.futures.InvalidStateError:  # answered meanwhile
                pass

    def _start(self, executable: str, headless: bool) -> None:
        from browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE
        from playwright.sync_api import sync_playwright

        self.playwright = sync_playwright().start()
        try:  # a private attribute: if playwright moves it, `driver_alive` just answers True
            self.driver = psutil.Process(self.playwright._impl_obj._connection._transport._proc.pid)
        except (AttributeError, psutil.Error):
            self.driver = None
        self.playwright.selectors.set_test_id_attribute(BROWSERGYM_ID_ATTRIBUTE)  # bids are playwright test ids
        self.browser = self.playwright.chromium.launch(
            executable_path=executable, headless=headless, args=["--disable-dev-shm-usage", "--disable-gpu"]
        )
        try:
            self.launched = self.driver.children() if self.driver else []
        except psutil.Error:
            self.launched = []

    def _stop(self) -> None:
        if not self.driver_alive():  # playwright's sync calls spin forever on a dead driver
            return
        for finish in (self.browser and self.browser.close, self.playwright and self.playwright.stop):
            try:
                if finish:
                    finish()
            except Exception:  # already gone (crashed, or the driver died): nothing to close
                pass

    def post(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Hand `fn(*args)` to the thread; its future. ChromiumGone if the thread no longer takes calls."""
        future: Future = Future()
        with self._lock:
            if not self._open or not self.driver_alive():
                raise ChromiumGone("playwright's driver process is gone")
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)
            self._loop.call_soon_threadsafe(self._call, future, fn, args)
        return future

    @staticmethod
    def _call(future: Future, fn: Callable[..., Any], args: tuple) -> None:
        from greenlet import greenlet

        def call() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to the caller
                future.set_exception(e)

        greenlet(call).switch()  # a child of the dispatcher: back to it when the call waits on playwright, or ends

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        """`fn(*args)` run in the thread: its result. ChromiumGone if the driver is gone, `_CallTimeout` if no
        answer comes within `timeout` seconds (the call goes on)."""
        future = self.post(fn, *args)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():  # the call itself raised it
                raise
        raise _CallTimeout(f"Chromium stopped answering for {timeout:.0f} s")

    def alive(self) -> bool:
        try:
            return self.run(self.browser.is_connected, timeout=30)
        except ChromiumGone:
            return False

    def driver_alive(self) -> bool:
        try:
            return self.driver is None or self.driver.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:  # exited (and reaped)
            return False

    def kill(self, driver: bool = False) -> None:
        """Kill Chromium (playwright then fails its pending calls) and, with `driver`, the driver too."""
        for process in [*self.launched, *([self.driver] if driver and self.driver else [])]:
            try:
                process.kill()
            except psutil.Error:  # gone already
                pass

    def close(self, wait: bool = True) -> None:
        """Close Chromium and the driver. With `wait`, wait for them, and kill what is left after 30 s (a hung
        stop, a Chromium that outlived its driver); without, the thread closes them on its own (what an env's
        __del__ does: a garbage collection may run in any thread, this one's included)."""
        with self._lock:
            stop = self._open and not self._stopping
            self._open, self._stopping = False, True
        if stop:
            self._loop.call_soon_threadsafe(self._main.switch)  # `_serve` goes on: it closes them
        if wait and threading.current_thread() is not self.thread:
            self.thread.join(30)
            self.kill(driver=True)


class _Session:
    """One env's browser context (its own page, cookies, storage and renderer) in a shared `_Chromium`."""

    def __init__(self, chromium: _Chromium) -> None:
        self.chromium = chromium
        self.context = self.page = None
        self.crashed = self.closed = False
        self.call_timeout = CALL_TIMEOUT_S
        try:
            self._run(self._open)
        except BaseException:
            self.close()
            raise

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self.chromium.run(fn, *args, timeout=self.call_timeout)
        except _CallTimeout:  # a page that hangs playwright (a dead renderer can): its context goes, not Chromium
            self.close(timeout=10)
            raise

    def _open(self) -> None:
        self.context = self.chromium.browser.new_context(viewport=VIEWPORT)
        self.context.set_default_timeout(TIMEOUT_MS)
        self._new_page()

    def _new_page(self) -> None:
        self.page = self.context.new_page()
        self.page.on("crash", self._on_crash)
        self.crashed = False

    def _on_crash(self, page: Any) -> None:
        self.crashed = True

    def _check_crash(self) -> bool:
        """Whether the page's renderer died (a round trip to the driver delivers its pending crash event) or the
        context is gone (with Chromium)."""
        try:
            self.context.cookies()
        except Exception:
            return True
        return self.crashed or self.page.is_closed()

    def setup(self, task: Any) -> tuple[str, PageState]:
        """Load and start `task` (a browsergym-miniwob task): its goal and the page."""
        return self._run(self._setup, task)

    def _setup(self, task: Any) -> tuple[str, PageState]:
        if self._check_crash():
            self._new_page()
        for other in self.context.pages:  # windows a click may have opened
            if other is not self.page:
                other.close()
        goal = task.setup(self.page)[0]
        return str(goal), self._read(task)

    def act(self, task: Any, action: Action) -> tuple[str, PageState]:
        """Do `action`: why it failed ('' if it did not) and the page after it."""
        return self._run(self._act, task, action)

    def _act(self, task: Any, action: Action) -> tuple[str, PageState]:
        gone = PageState(tree="", raw_reward=-1.0, done=True, solved=False)
        if self._check_crash():
            return "the page crashed; the episode is over", gone
        try:
            error = _perform(self.page, action)
            self.page.wait_for_timeout(SETTLE_MS)
            return error, self._read(task)
        except Exception as e:  # the page crashed or closed under the action: the episode ends unsolved
            return f"the page could not be read ({type(e).__name__}); the episode is over", gone

    def _read(self, task: Any) -> PageState:
        self.page.wait_for_load_state("domcontentloaded", timeout=TIMEOUT_MS)
        reward, done, _, info = task.validate(self.page, [])  # reward: raw reward > 0; left the page: done, no raw
        raw = float(info.get("RAW_REWARD_GLOBAL", -1.0))
        return PageState(_extract_tree(self.page), raw, bool(done), bool(done) and reward > 0)

    def close(self, wait: bool = True, timeout: float = 30) -> None:
        """Close the context (posted, not waited for, without `wait`); one that will not close takes Chromium
        down with it (the next reset launches another)."""
        if self.closed:
            return
        self.closed = True
        try:
            if wait:
                self.chromium.run(self._close, timeout=timeout)
            else:
                self.chromium.post(self._close)
        except _CallTimeout:
            self.chromium.kill()
        except ChromiumGone:  # the context went with its Chromium
            pass

    def _close(self) -> None:
        try:
            if self.context is not None:
                self.context.close()
        except Exception:  # crashed, or gone with Chromium
            pass


class _Shared:
    """The process's `_Chromium` for one binary and mode, shared by the MiniWoB envs using it: launched for the
    first that needs it, launched again when found dead, closed when the last lets go."""

    def __init__(self, executable: str, headless: bool) -> None:
        self.executable, self.headless = executable, headless
        self.chromium: _Chromium | None = None
        self.users = self.launches = 0
        # users and chromium: held briefly, never while waiting on Chromium (an env's __del__ takes it, in any
        # thread: one waiting on that thread would deadlock); an RLock, as that __del__ may run inside it
        self._count = threading.RLock()
        self._launch = threading.Lock()  # one check-and-relaunch at a time: held while waiting on Chromium

    def acquire(self) -> None:
        with self._count:
            self.users += 1

    def release(self, wait: bool = True) -> None:
        with self._count:
            self.users -= 1
            last = self.chromium if self.users == 0 else None
            if last is not None:
                self.chromium = None
        if last is not None:
            last.close(wait)

    def current(self) -> _Chromium:
        """The running Chromium, launched if there is none or it died (Chromium crashed or killed, or closed)."""
        with self._launch:
            chromium = self.chromium
            if chromium is not None and chromium.alive():
                return chromium
            fresh = _Chromium(self.executable, self.headless)
            with self._count:
                self.chromium, self.launches = fresh, self.launches + 1
        if chromium is not None:  # what is left of the dead one goes
            chromium.close()
        return fresh


_SHARED: dict[tuple[str, bool], _Shared] = {}  # (executable, headless) -> its shared Chromium
_SHARED_LOCK = threading.Lock()


def _shared(executable: str, headless: bool) -> _Shared:
    with _SHARED_LOCK:
        if (executable, headless) not in _SHARED:
            _SHARED[executable, headless] = _Shared(executable, headless)
        return _SHARED[executable, headless]


def browsergym_tree(page: Any) -> str:
    """BrowserGym's flattened accessibility tree of `page`, as its BrowserEnv builds it (tab-indented), without
    the ignored roles and the root's url. The text browser's parity test compares against this too."""
    from browsergym.core.observation import _post_extract, _pre_extract, extract_merged_axtree
    from browsergym.utils.obs import flatten_axtree_to_str

    _pre_extract(page, tags_to_mark="standard_html", lenient=True)
    try:
        tree = extract_merged_axtree(page)
    finally:
        _post_extract(page)
    return re.sub(r", url='[^']*'", "", flatten_axtree_to_str(tree, ignored_roles=IGNORED_ROLES), count=1)


def _extract_tree(page: Any) -> str:
    """`browsergym_tree` with one space per level instead of a tab (observations are printable ASCII)."""
    lines = []
    for line in browsergym_tree(page).splitlines():
        body = line.lstrip("\t")
        lines.append(" " * (len(line) - len(body)) + body)
    return "\n".join(lines)


def _perform(page: Any, action: Action) -> str:
    """Do `action` on the page as BrowserGym's action functions do; '' or why it failed (one line)."""
    from browsergym.core.action.utils import get_elem_by_bid

    name, args = action.name, action.args
    if name in NOT_HERE:
        return f"{name} does nothing here (one page, no chat): act on the page"
    if name == "noop":
        wait = args.get("wait_ms", MAX_NOOP_MS)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait != wait:
            return "noop: wait_ms must be a number of milliseconds"
        page.wait_for_timeout(float(min(max(wait, 0), MAX_NOOP_MS)))
        return ""
    if name == "scroll":
        dx, dy = (float(min(max(args[k], -MAX_SCROLL), MAX_SCROLL)) for k in ("delta_x", "delta_y"))
        page.mouse.wheel(dx, dy)
        return ""
    button, modifiers = args.get("button", "left"), args.get("modifiers", [])
    modifiers = [modifiers] if isinstance(modifiers, str) else modifiers
    if button not in BUTTONS:
        return f"{name}: button must be one of {', '.join(BUTTONS)}"
    if not isinstance(modifiers, (list, tuple)) or not all(m in MODIFIERS for m in modifiers):
        return f"{name}: modifiers must be a list of {', '.join(MODIFIERS)}"
    try:
        elem = get_elem_by_bid(page, args["bid"])
        if name in ("click", "dblclick"):
            getattr(elem, name)(button=button, modifiers=list(modifiers), timeout=ACTION_TIMEOUT_MS)
        elif name == "fill":
            elem.fill(args["value"], timeout=ACTION_TIMEOUT_MS)
        elif name == "select_option":
            elem.select_option(args["options"], timeout=ACTION_TIMEOUT_MS)
        elif name == "press":
            elem.press(args["key_comb"], timeout=ACTION_TIMEOUT_MS)
        else:  # check, uncheck, focus, clear, hover: the element is all they take
            getattr(elem, name)(timeout=ACTION_TIMEOUT_MS)
    except Exception as e:  # playwright's errors (timeouts, wrong element kind) and unknown bids
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"{name} failed: {message}"[:200]
    return ""


class MiniWoBEnv(AgentEnv):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    concurrent_steps = True  # calls run interleaved in Chromium's thread: the rollout engine may step envs in threads

    def __init__(
        self,
        tasks: Sequence[str] = DEFAULT_TASKS,
        max_turns: int = 10,
        page_chars: int = 1500,
        headless: bool = True,
        chromium: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        for name, value, low in (("max_turns", max_turns, 1), ("page_chars", page_chars, 200)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        missing = missing_requirement(bool(headless), chromium)
        if missing:
            raise MiniWoBUnavailable(missing)
        self.classes = task_classes()
        unknown = [t for t in tasks if t not in self.classes]
        if unknown or not tasks:
            raise ValueError(f"unknown MiniWoB task {unknown[0] if unknown else None!r}; e.g. {list(DEFAULT_TASKS)}")
        self.tasks, self.max_turns, self.page_chars = tasks, max_turns, page_chars
        self.headless, self.render_mode = bool(headless), render_mode
        self.executable = chromium or find_chromium(self.headless)
        self.base_url = miniwob_html_dir().as_uri() + "/"
        self.instructions = INSTRUCTIONS
        self.stop_strings: list[str] = []
        self.action_space = FreeText(20_000)
        self.observation_space = ascii_text_space(page_chars + 1000)
        self._shared = _shared(self.executable, self.headless)  # the process's Chromium, launched on demand
        self._holding = False  # whether this env counts as one of its users (from its first use until close())
        self.session: _Session | None = None  # the env's browser context in it
        self.task: Any = None  # the episode's browsergym-miniwob task
        self.task_name, self.goal, self.error = "", "", ""
        self.state = PageState("", 0.0, False, False)
        self.last_observation = ""
        self._turn, self._done = 0, True

    def _chromium(self) -> _Chromium:
        """The process's shared Chromium, launched (again, if it died) on demand; held until `close()`."""
        if not self._holding:
            self._shared.acquire()
            self._holding = True
        return self._shared.current()

    def _session(self, restart: bool = False) -> _Session:
        """The env's browser context, opened (again, if it was closed, its Chromium relaunched, or `restart`)."""
        chromium = self._chromium()
        if self.session is not None and (restart or self.session.closed or self.session.chromium is not chromium):
            self.session.close()
            self.session = None
        if self.session is None:
            self.session = _Session(chromium)
        return self.session

    # -------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        task_seed = int(self.np_random.integers(2**31)) if seed is None else int(seed)
        rng = np.random.default_rng([task_seed, 47])
        if options and "task" in options:
            self.task_name = str(options["task"])
            if self.task_name not in self.classes:
                raise ValueError(f"unknown MiniWoB task {self.task_name!r}")
        else:
            self.task_name = self.tasks[int(rng.integers(len(self.tasks)))]
        # browsergym's task seeds MiniWoB's Math.seedrandom from this seed (through its own RandomState)
        self.task = self.classes[self.task_name](seed=int(rng.integers(2**32)), base_url=self.base_url)
        try:
            self.goal, self.state = self._session().setup(self.task)
        except Exception:  # the context or Chromium died under the page: a fresh context (and Chromium), once
            self.goal, self.state = self._session(restart=True).setup(self.task)
        self.error, self._turn, self._done = "", 0, False
        info = {"is_success": False, "action_is_valid": True, "feedback": "", "task": self.task_name}
        return self._observe(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None or self.session is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        self._turn += 1
        parsed = parse_action(action)
        if isinstance(parsed, ParseError):  # the page is left alone: no need to read it again
            self.error = f"invalid action: {parsed.reason}"
        else:
            try:
                self.error, self.state = self.session.act(self.task, parsed)
            except ChromiumGone:  # the next reset opens a fresh context (in a fresh Chromium if need be)
                self.error = "the browser is gone; the episode is over"
                self.state = PageState(tree="", raw_reward=-1.0, done=True, solved=False)
        terminated = self.state.done
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        reward = 1.0 if self.state.solved else 0.0
        info = {
            "is_success": self.state.solved,
            "action_is_valid": isinstance(parsed, Action),
            "shaped_reward": reward,
            "feedback": (self.error or "ok")[:200],
            "action": str(parsed) if isinstance(parsed, Action) else "",
            "task": self.task_name,
            "raw_reward": self.state.raw_reward,
        }
        if self._done:
            info["action_is_correct"] = self.state.solved
        return self._observe(), reward, terminated, truncated, info

    def _observe(self) -> str:
        self.last_observation = self._format(self.goal, self.error, self.state.tree, self._done)
        return self.last_observation

    def _format(self, goal: str, error: str, tree: str, done: bool) -> str:
        """The observation of a page: the goal, the error if any, the tree (capped), the end if over."""
        if len(tree) > self.page_chars:  # whole lines only
            tree = tree[: self.page_chars].rsplit("\n", 1)[0] + "\n(the rest of the page is cut)"
        lines = [f"Goal: {goal[:500]}"]
        if error:
            lines.append(f"Error: {error}")
        lines.append(tree)
        if done:
            lines.append("The episode is over.")
        return printable("\n".join(lines))[: self.observation_space.max_length]

    # -------------------------------------------------------------- worked examples
    def worked_examples(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        """`count` (observation, reply) turns of the oracle on instances no env seed draws, round robin over
        `tasks` (see the module's "Worked examples"); the same for the same seed, tasks and page_chars."""
        return [(e.observation, e.reply) for e in self.example_turns(count, seed)]

    def example_turns(self, count: int, seed: int = 0) -> list[WorkedExample]:
        """`worked_examples` with each turn's task and turn number (what the tests check them against)."""
        key = (tuple(self.tasks), self.page_chars, int(seed))
        built = _EXAMPLES.setdefault(key, [])
        while sum(len(r) for r in built) < count:
            found = self._example_round(int(seed), len(built))
            if not found:
                raise NotImplementedError(f"MiniWoBEnv has no worked examples for tasks {self.tasks} (the oracle "
                                          f"covers {list(DEFAULT_TASKS)}): set env.few_shot to 0")
            built.append(found)
        return [e for r in built for e in r][: max(count, 0)]

    def _example_round(self, seed: int, round_: int) -> list[WorkedExample]:
        """One turn of one fresh instance of each task the oracle covers; new action kinds first."""
        found = []
        session = _Session(self._chromium())  # a context of its own: the episode's page and state are left alone
        try:
            for name in dict.fromkeys(self.tasks):
                if name not in DEFAULT_TASKS:  # no oracle
                    continue
                rng = np.random.default_rng([seed & (2**64 - 1), EXAMPLE_STREAM, zlib.crc32(name.encode()), round_])
                task = self.classes[name](seed=int(rng.integers(2**32)), base_url=self.base_url)
                goal, state = session.setup(task)
                observation = self._format(goal, "", state.tree, False)
                plan = oracle_actions(name, observation)
                turn = round_ % len(plan)
                for action in plan[:turn]:
                    error, state = session.act(task, parse_action(action))
                    if error or state.done:
                        raise RuntimeError(f"the MiniWoB oracle failed on {name}: {error or 'ended early'}")
                    observation = self._format(goal, "", state.tree, False)
                found.append(WorkedExample(name, turn, observation, canonical_call(plan[turn])))
        finally:
            session.close()
        lead = {e.action: k for k, e in reversed(list(enumerate(found)))}.values()  # each action kind's first
        return [found[k] for k in sorted(range(len(found)), key=lambda k: (k not in lead, k))]

    def render(self) -> str | None:
        return self.last_observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Close the env's context; the last env to close takes the shared Chromium down."""
        self._let_go(wait=True)
        super().close()

    def _let_go(self, wait: bool) -> None:
        if self.session is not None:
            self.session.close(wait)
            self.session = None
        if self._holding:
            self._holding = False
            self._shared.release(wait)

    def __del__(self) -> None:  # an env dropped without close() still gives back its context and its hold
        try:  # not waiting: a garbage collection may run in any thread, Chromium's own included
            self._let_go(wait=False)
        except Exception:  # at interpreter exit: playwright's driver ends Chromium as the process goes
            pass


@dataclass(frozen=True)
class WorkedExample:
    """One worked turn: the task, which turn of the oracle's solution, what the agent sees, the reply."""

    task: str
    turn: int
    observation: str
    reply: str

    @property
    def action(self) -> str:
        return self.reply.split("(", 1)[0]


_EXAMPLES: dict[tuple, list[list[WorkedExample]]] = {}  # (tasks, page_chars, seed) -> the rounds built so far


def canonical_call(reply: str) -> str:
    """A reply's action call as the model should write it: positional literals, strings in double quotes, one
    option as a string (`select_option("13", "Lola")`)."""
    action = parse_action(reply)
    if not isinstance(action, Action):
        raise ValueError(f"not an action call: {reply!r} ({action.reason})")
    values = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in action.args.values()]
    args = ", ".join(json.dumps(v) if isinstance(v, (str, list)) else repr(v) for v in values)
    call = f"{action.name}({args})"
    return call if parse_action(call) == action else str(action)


# ------------------------------------------------------------------ scripted oracle
_ELEMENT = re.compile(r"^\s*\[(?P<bid>[^\]]+)\] (?P<role>\S+) (?P<q>['\"])(?P<name>.*?)(?P=q)", re.M)


def page_elements(observation: str) -> list[tuple[str, str, str]]:
    """(bid, role, name) of every element with a bid in an observation's tree."""
    return [(m["bid"], m["role"], m["name"]) for m in _ELEMENT.finditer(observation)]


def _bid(elements: list[tuple[str, str, str]], role: str, name: str | None = None) -> str:
    for bid, r, n in elements:
        if r == role and (name is None or n == name):
            return bid
    raise ValueError(f"no {role} {name!r} on the page")


def oracle_actions(task: str, observation: str) -> list[str]:
    """The replies that solve `task` from its first observation (the goal and the tree, as an agent sees them).
    Covers `DEFAULT_TASKS`; ValueError for another task or a page it cannot read."""
    goal = observation.split("\n", 1)[0].removeprefix("Goal: ")
    els = page_elements(observation)
    quoted = re.findall(r'"([^"]*)"', goal)
    def submit() -> str:
        return f'click("{_bid(els, "button", "Submit")}")'

    if task == "click-test":
        return [f'click("{_bid(els, "button")}")']
    if task == "click-button":
        return [f'click("{_bid(els, "button", quoted[0])}")']
    if task == "click-button-sequence":
        return [f'click("{_bid(els, "button", "ONE")}")', f'click("{_bid(els, "button", "TWO")}")']
    if task == "click-dialog":
        return [f'click("{_bid(els, "button", "Close")}")']
    if task == "click-checkboxes":
        names = re.fullmatch(r"Select (.*) and click Submit\.", goal)[1]
        picks = [] if names == "nothing" else names.split(", ")
        return [f'click("{_bid(els, "checkbox", n)}")' for n in picks] + [submit()]
    if task == "click-option":
        name = re.fullmatch(r"Select (.*) and click Submit\.", goal)[1]
        return [f'click("{_bid(els, "radio", name)}")', submit()]
    if task == "choose-list":
        name = re.fullmatch(r"Select (.*) from the list and click Submit\.", goal)[1]
        return [f'select_option("{_bid(els, "combobox")}", {name!r})', submit()]
    if task == "focus-text":
        return [f'focus("{_bid(els, "textbox")}")']
    if task == "enter-text":
        return [f'fill("{_bid(els, "textbox")}", {quoted[0]!r})', submit()]
    if task == "login-user":
        boxes = [bid for bid, role, _ in els if role == "textbox"]
        login = _bid(els, "button", "Login")
        return [f'fill("{boxes[0]}", {quoted[0]!r})', f'fill("{boxes[1]}", {quoted[1]!r})', f'click("{login}")']
    raise ValueError(f"no oracle for MiniWoB task {task!r}; it covers {list(DEFAULT_TASKS)}")
