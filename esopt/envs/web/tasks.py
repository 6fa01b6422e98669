"""Task templates and the tasks they make, in WebArena's JSON schema.

A template is a function of (template database, rng) registered with `@template(...)`: it picks the instantiation
from the data, computes the answer from the same data, and returns `spec(...)`. `make_task(name, seed)` gives
the task dict: WebArena's keys (`intent_template`, `instantiation_dict`, `intent`, `start_url`, `sites`,
`require_reset`, `eval` with `eval_types`, `reference_answers`, `reference_url`, `program_html`,
`intent_template_id`) plus esopt's `tier` (1: the answer is on the start page or one action away; 2: two to
three pages; 3: several pages and a form), `split` (train / validation / test, fixed per template, so held-out
tasks are held-out templates) and `oracle` (the scripted steps that solve it, see `esopt.envs.web.oracle`).
The template modules register themselves here; `esopt.envs.web.catalog` loads them all and makes the tasks.

Oracle steps: ["click", role, name, near?], ["fill", role, name, text], ["select", role, name, option],
["check" | "uncheck", role, name], ["scroll"], ["answer", text]. `name` is the element's accessible name; `near`
a text of the row, list item, article or form it sits in.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SITE_KEYS = {"shop": "shopping", "admin": "shopping_admin", "forum": "reddit", "wiki": "wikipedia"}
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Template:
    id: int
    name: str
    site: str  # shop | admin | forum | wiki
    tier: int
    split: str
    intent_template: str
    make: Callable[[sqlite3.Connection, random.Random], dict]


TEMPLATES: dict[str, Template] = {}


def template(site: str, tier: int, split: str, intent: str) -> Callable:
    """Register a task template (its function's name is the template's name)."""
    if site not in SITE_KEYS or tier not in (1, 2, 3) or split not in SPLITS:
        raise ValueError(f"bad template registration: site={site!r} tier={tier!r} split={split!r}")

    def register(fn: Callable) -> Callable:
        TEMPLATES[fn.__name__] = Template(len(TEMPLATES), fn.__name__, site, tier, split, intent, fn)
        return fn

    return register


def answer_check(exact: str | None = None, include: list[str] | None = None) -> dict:
    ref: dict[str, Any] = {}
    if exact is not None:
        ref["exact_match"] = str(exact)
    if include:
        ref["must_include"] = [str(x) for x in include]
    return ref


def db_check(name: str, exact: Any = None, include: list[str] | None = None, **args: Any) -> dict:
    """A program_html entry that reads the database with the named check `name`."""
    return {
        "url": "last",
        "locator": f"py:{name}",
        "args": args,
        "required_contents": answer_check(None if exact is None else str(exact), include),
    }


def page_check(url: str, locator: str, exact: Any = None, include: list[str] | None = None) -> dict:
    """A program_html entry that reads a page (`url`, or "last") through a CSS locator ("" = its whole text)."""
    return {
        "url": url,
        "locator": locator,
        "required_contents": answer_check(None if exact is None else str(exact), include),
    }


def spec(
    inst: dict,
    start: str,
    oracle: list[list],
    exact: Any = None,
    include: list[str] | None = None,
    url: str | None = None,
    program: list[dict] | None = None,
) -> dict:
    """What a template returns: the instantiation, the start URL (with a site placeholder), the oracle, and the
    checks (an answer: `exact` / `include`; a final URL: `url`; end-state checks: `program`)."""
    types = []
    if exact is not None or include:
        types.append("string_match")
    if url:
        types.append("url_match")
    if program:
        types.append("program_html")
    if not types:
        raise ValueError("a task needs at least one check")
    return {
        "inst": {k: str(v) for k, v in inst.items()},
        "start": start,
        "oracle": oracle,
        "eval": {
            "eval_types": types,
            "reference_answers": answer_check(None if exact is None else str(exact), include)
            if "string_match" in types
            else None,
            "reference_url": url or "",
            "program_html": program or [],
            "url_note": "GOLD in PRED",
            "string_note": "",
        },
    }


def render_intent(intent_template: str, inst: dict[str, str]) -> str:
    text = intent_template
    for key, value in inst.items():
        text = text.replace("{{" + key + "}}", value)
    return text


# ---------------------------------------------------------------- helpers for the template modules
def pick(db: sqlite3.Connection, rng: random.Random, sql: str, *args: Any) -> dict:
    found = [dict(r) for r in db.execute(sql, args)]
    if not found:
        raise RuntimeError(f"no data for a task: {sql}")
    return rng.choice(found)


def answer(text: Any) -> list:
    return ["answer", str(text)]


def click(role: str, name: str, near: str | None = None) -> list:
    return ["click", role, name] + ([near] if near else [])


def fill(role: str, name: str, text: Any) -> list:
    return ["fill", role, name, str(text)]


def select(role: str, name: str, option: str) -> list:
    return ["select", role, name, option]


DONE = answer("Done.")
