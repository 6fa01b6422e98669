"""`esopt/Web-v0`: WebArena-style web tasks on four small sites served on loopback, through a text browser.

## Description
The agent browses a shop, its admin, a forum and a wiki (`esopt.envs.web.app`, one local server, no JavaScript)
to answer a question or change something: "What is the cheapest product in the Kitchen category?", "Cancel my
order #53", "Create a post in the cooking forum titled ...". Tasks come from 50 templates in WebArena's JSON
schema (`esopt.envs.web.tasks`) over three tiers: 1, the answer is on the start page; 2, two or three pages; 3,
several pages and a form. Each template belongs to one split, and the seed picks the split the way esopt's
trainers draw seeds: training seeds (< 2^31) get training templates, test seeds ([2^31, 2^31 + 2^30)) test
templates, validation seeds (above) validation templates; `split` overrides that.

## Action
Text: one BrowserGym call, e.g. `click("12")`, `fill("14", "blue mug")`, `select_option("7", "Express")`,
`scroll(0, 300)`, `go_back()`, `goto("http://localhost/shop/")`, `send_msg_to_user("42")` (the answer; it ends
the episode). Thoughts around the call are allowed; a reply with no valid call costs a turn and the next
observation says why.

## Observation
The goal, the URL, the last action's error if any, and one screen of the page's accessibility tree flattened as
BrowserGym prints it (`[bid] role 'name'`), at most `page_chars` characters; `scroll` shows the other screens.

## Starting state
A fresh copy of the sites' database (the per-episode copy takes about a millisecond), the persona signed in to
every site, the browser at the task's `start_url`.

## Rewards
1 when the episode ends with every check of the task passing (WebArena's product of `string_match`, `url_match`
and `program_html`), else 0. `info["shaped_reward"]`: the share of checks passed.

## Episode end
Terminated by `send_msg_to_user` or `report_infeasible`; truncated after `max_turns` replies (the end state is
still scored, so a finished action task counts without a final message).

## Arguments
`sites` (subset of shop, admin, forum, wiki), `tiers` (subset of 1, 2, 3), `split` ("auto", "train",
"validation", "test" or "all"), `templates` (names; overrides sites and tiers), `max_turns` (20), `page_chars`
(1000, about 400 tokens), `data_seed` (the world's data, 0), `server_linger` (seconds the server outlives its last
env, 0), `render_mode` (None or "ansi").

## Versions
v0: first version.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from esopt.envs.base import AgentEnv
from esopt.envs.text_space import FreeText, ascii_text_space
from esopt.envs.tools.react import printable
from esopt.envs.web import server as web_server
from esopt.envs.web.actions import ACTION_HELP, Action, ParseError, parse_action
from esopt.envs.web.app import COOKIE
from esopt.envs.web.browser import DISPLAY_ORIGIN, BrowserError, TextBrowser
from esopt.envs.web.catalog import make_task, templates
from esopt.envs.web.evaluators import evaluate, expand
from esopt.envs.web.tasks import SPLITS
from esopt.envs.web.world import load_db

SITES = ("shop", "admin", "forum", "wiki")
TEST_BASE, VALIDATION_BASE = 2**31, 2**31 + 2**30
# worked examples: training templates (1 and 2 steps) at seeds above every task seed, so no task is its own example
# Training templates, seeds beyond every task seed. After the first three turns (an answer, a click, an answer)
# come direct answers from the other sites, so a longer few-shot shows more than one answer to copy.
DEMOS = (("wiki_population", 2**32 + 7), ("wiki_capital", 2**32 + 7), ("shop_price", 2**32 + 7),
         ("forum_post_author", 2**32 + 7), ("admin_customer_email", 2**32 + 7))
INSTRUCTIONS = f"""You are a web agent. You browse websites on {DISPLAY_ORIGIN}: a shop (/shop/), its admin (/admin/), \
a forum (/forum/) and a wiki (/wiki/). You are already signed in. Each turn you see the goal, the page's URL and its \
accessibility tree: one element a line as [bid] role 'name'. Reply with one action, e.g.: {ACTION_HELP}. \
Use the bid in brackets to name an element. When the goal asks a question, answer with send_msg_to_user("answer"); \
when it asks you to do something, do it, then send_msg_to_user("done")."""


def seed_split(seed: int) -> str:
    return "train" if seed < TEST_BASE else "test" if seed < VALIDATION_BASE else "validation"


class WebEnv(AgentEnv):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    concurrent_steps = True  # steps wait on HTTP: the rollout engine may step envs in threads

    def __init__(
        self,
        sites: Sequence[str] = SITES,
        tiers: Sequence[int] = (1, 2, 3),
        split: str = "auto",
        templates: Sequence[str] | None = None,
        max_turns: int = 20,
        page_chars: int = 1000,
        data_seed: int = 0,
        server_linger: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        sites, tiers = ([sites] if isinstance(sites, str) else list(sites)), list(tiers)
        if not sites or any(s not in SITES for s in sites):
            raise ValueError(f"sites must be a non-empty subset of {list(SITES)}, got {sites!r}")
        if not tiers or any(t not in (1, 2, 3) for t in tiers):
            raise ValueError(f"tiers must be a non-empty subset of [1, 2, 3], got {tiers!r}")
        if split not in ("auto", "all", *SPLITS):
            raise ValueError(f"split must be 'auto', 'all' or one of {list(SPLITS)}, got {split!r}")
        for name, value, low in (("max_turns", max_turns, 1), ("page_chars", page_chars, 300)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.pool = self._pool(tuple(sites), tuple(tiers), templates)
        self.split, self.max_turns, self.page_chars = split, max_turns, page_chars
        self.data_seed, self.server_linger, self.render_mode = int(data_seed), float(server_linger), render_mode
        self.instructions = INSTRUCTIONS
        self.stop_strings: list[str] = []
        self.action_space = FreeText(20_000)
        self.observation_space = ascii_text_space(page_chars + 2000)
        self.server: web_server.Server | None = None
        self.browser: TextBrowser | None = None
        self.episode_id = ""
        self.task: dict[str, Any] = {}
        self.last_observation = ""
        self._turn, self._done = 0, True

    @staticmethod
    def _pool(sites: tuple, tiers: tuple, names: Sequence[str] | None) -> dict[str, list[str]]:
        chosen = templates(sites, tiers)
        if names is not None:
            known = {t.name: t for t in templates()}
            bad = [n for n in names if n not in known]
            if bad or not names:
                raise ValueError(f"unknown template {bad[0] if bad else None!r}; e.g. {sorted(known)[:4]}")
            chosen = [known[n] for n in names]
        pool = {s: [t.name for t in chosen if t.split == s] for s in SPLITS}
        pool["all"] = [t.name for t in chosen]
        return pool

    # -------------------------------------------------------------- server and episode plumbing
    def _ensure_browser(self) -> TextBrowser:
        if self.server is None or self.server.process.poll() is not None:
            if self.server is not None:
                web_server.release(self.server)
            self.server = web_server.acquire(self.data_seed)
            if self.browser is not None:
                self.browser.close()
            self.browser = TextBrowser(self.server.origin, page_chars=self.page_chars)
        return self.browser

    def _new_episode(self, browser: TextBrowser) -> str:
        eid = uuid.uuid4().hex
        drop, self.episode_id = self.episode_id, ""
        browser.client.post(f"{browser.origin}/_esopt/episodes/{eid}", params={"drop": drop}).raise_for_status()
        browser.client.cookies.clear()
        browser.client.cookies.set(COOKIE, eid)
        browser.back.clear()
        browser.forward.clear()
        browser.url = ""
        return eid

    def _drop_episode(self) -> None:
        if self.episode_id and self.browser is not None:
            try:
                self.browser.client.delete(f"{self.browser.origin}/_esopt/episodes/{self.episode_id}")
            except Exception:  # the server is gone already: nothing to drop
                pass
        self.episode_id = ""

    def choose_task(self, seed: int, options: Mapping[str, Any] | None) -> dict[str, Any]:
        if options and "task" in options:
            return dict(options["task"])
        if options and "template" in options:
            return make_task(str(options["template"]), seed, self.data_seed)
        split = seed_split(seed) if self.split == "auto" else self.split
        names = self.pool[split]
        if not names:
            raise ValueError(f"no {split} template matches these sites and tiers; pass split='all' or widen them")
        name = names[int(np.random.default_rng([seed, 29]).integers(len(names)))]
        return make_task(name, seed, self.data_seed)

    # -------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        task_seed = int(self.np_random.integers(2**31)) if seed is None else int(seed)
        self.task = self.choose_task(task_seed, options)
        browser = self._ensure_browser()
        self.episode_id = self._new_episode(browser)
        browser.last_error = ""
        try:
            browser.load(expand(self.task["start_url"], browser.origin), record=False)
        except BrowserError as e:
            raise RuntimeError(f"web env: the start page did not load: {e}") from None
        self._turn, self._done, self.answer = 0, False, None
        info = {
            "is_success": False,
            "action_is_valid": True,
            "feedback": "",
            "template": self.task.get("template", ""),
            "tier": int(self.task.get("tier", 0)),
        }
        return self._observe(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self.task or self.browser is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        self._turn += 1
        self.browser.last_error = ""  # an error reports this turn's action only
        parsed = parse_action(action)
        valid, terminated = True, False
        if isinstance(parsed, ParseError):
            valid = False
            self.browser.last_error = f"invalid action: {parsed.reason}"
        elif parsed.name in ("send_msg_to_user", "report_infeasible"):
            self.answer = parsed.args.get("text", parsed.args.get("reason", ""))
            terminated = True
        else:
            self.browser.act(parsed)
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        info = {
            "is_success": False,
            "action_is_valid": valid,
            "shaped_reward": 0.0,
            "feedback": (self.browser.last_error or "ok")[:200],
            "url": self.browser.display(self.browser.url)[:300],
            "action": str(parsed) if isinstance(parsed, Action) else "",
            "template": self.task.get("template", ""),
            "tier": int(self.task.get("tier", 0)),
            "eval_types": "+".join(self.task.get("eval", {}).get("eval_types", [])),
        }
        reward = 0.0
        if self._done:
            result = self.evaluate()
            reward = result.score
            info.update(
                is_success=result.score == 1.0,
                shaped_reward=float(result.shaped),
                action_is_correct=result.score == 1.0,
                checks=[ok for _, ok in result.checks],
                answer=self.answer or "",
            )
            if result.score < 1.0 and info["feedback"] == "ok":  # what a reflector can learn from (never shown)
                failed = sum(not ok for _, ok in result.checks)
                info["feedback"] = f"wrong: {failed} of {len(result.checks)} checks failed"
        return self._observe(), reward, terminated, truncated, info

    def evaluate(self):
        """Score the current end state with the task's evaluators (fetches the episode's database)."""
        browser = self.browser
        try:
            response = browser.client.get(f"{browser.origin}/_esopt/episodes/{self.episode_id}/db")
            db = load_db(response.content) if response.status_code == 200 else None
        except httpx.HTTPError:  # the server died: the database checks fail, the episode still ends cleanly
            db = None
        parts = urlsplit(browser.url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")

        def fetch(url: str) -> bytes:
            try:
                return browser.client.get(browser.resolve(url)).content
            except Exception:  # an unreachable page reads as empty: its checks fail
                return b""

        try:
            return evaluate(self.task, self.answer, path, browser.html, fetch, db)
        finally:
            if db is not None:
                db.close()

    def _observe(self) -> str:
        text = f"Goal: {self.task['intent'][:500]}\n{self.browser.observation()}"
        if self._done:
            text += "\nThe episode is over."
        elif self.max_turns - self._turn == 1:
            text += "\n(last turn: send your answer)"
        self.last_observation = printable(text)[: self.observation_space.max_length]
        return self.last_observation

    def render(self) -> str | None:
        return self.last_observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        self._drop_episode()
        if self.browser is not None:
            self.browser.close()
            self.browser = None
        if self.server is not None:
            web_server.release(self.server, self.server_linger)
            self.server = None
        super().close()

    def worked_examples(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        """(observation, action) pairs of the oracle solving fixed training tasks (a one-step answer, then a click
        and an answer), in a sibling env (this one's episode is left alone)."""
        key = (self.data_seed, self.page_chars, self.max_turns)
        if key not in _DEMOS:
            self._ensure_browser()  # holds the server while the demo envs come and go
            from esopt.envs.web.oracle import run_oracle

            pairs: list[tuple[str, str]] = []
            for name, demo_seed in DEMOS:
                demo = WebEnv(templates=[name], split="all", max_turns=self.max_turns, page_chars=self.page_chars,
                              data_seed=self.data_seed, server_linger=self.server_linger)
                try:
                    demo.reset(seed=demo_seed)
                    pairs += run_oracle(demo)[2]
                finally:
                    demo.close()
            _DEMOS[key] = pairs
        return list(_DEMOS[key][:count])


_DEMOS: dict[tuple, list[tuple[str, str]]] = {}
