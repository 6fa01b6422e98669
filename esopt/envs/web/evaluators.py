"""WebArena's evaluators, deterministic: `string_match`, `url_match` and `program_html`, scores multiplied.

A task's `eval` is WebArena's: `eval_types` lists the evaluators; `reference_answers` holds `exact_match` (one
string) and/or `must_include` (strings that must all appear; `a |OR| b` accepts either); `reference_url` is matched
against the final URL (path equal, the reference's query arguments present; `|OR|` alternatives); each
`program_html` entry reads something from the end state and compares it to `required_contents`
(`exact_match` or `must_include`): its `locator` is "" (the page's visible text), a CSS selector (also written as
WebArena's `document.querySelector('...').outerText`), or `py:NAME` with `args`, a named check of the episode's
database (`DB_CHECKS`). Numbers compare as numbers, so "$1,020.00", "1020" and "1,020" are one answer.
`fuzzy_match` needs an LLM judge and is refused. Every atomic check counts once for the shaped reward (the share
passed); the score is their product.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from esopt.envs.web.axtree import css_text, page_text, parse_page, squash
from esopt.envs.web.world import PERSONA_ID

PLACEHOLDERS = {
    "__SHOPPING_ADMIN__": "/admin",
    "__SHOPPING__": "/shop",
    "__REDDIT__": "/forum",
    "__WIKIPEDIA__": "/wiki",
}
_NUMBER = re.compile(r"^[-+]?\$?\s*[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?\s*%?$")
_NUMBERS_IN = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?")
_QUERY_SELECTOR = re.compile(r"""^document\.querySelector\((['"])(.+)\1\)\.(?:outerText|innerText|textContent)$""")


def expand(url: str, origin: str = "") -> str:
    """A task URL with WebArena's site placeholders replaced by `origin` + the site's path prefix."""
    for key, path in PLACEHOLDERS.items():
        url = url.replace(key, origin + path)
    return url


def to_number(text: str) -> float | None:
    """'$1,234.50' -> 1234.5, '12 %' -> 12.0; None for anything that is not just a number."""
    text = squash(str(text)).strip().rstrip(".")
    text = re.sub(r"(?i)^(usd|us\$)\s*|\s*(usd|dollars?)$", "", text)
    if not text or not _NUMBER.match(text) or not re.search(r"\d", text):
        return None
    try:
        return float(re.sub(r"[$,%\s+]", "", text))
    except ValueError:
        return None


def clean(text: str) -> str:
    return squash(str(text)).strip().strip("\"'`").rstrip(".").strip().casefold()


def exact_match(pred: str, ref: str) -> bool:
    a, b = to_number(pred), to_number(ref)
    if a is not None and b is not None:
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    return clean(pred) == clean(ref)


def must_include(pred: str, item: str) -> bool:
    """One must_include item: any of its `|OR|` alternatives is in `pred` (numbers: a number in pred equals it)."""
    for alt in str(item).split("|OR|"):
        alt = alt.strip()
        value = to_number(alt)
        if value is not None:
            if any(to_number(n) == value for n in _NUMBERS_IN.findall(str(pred))):
                return True
        elif clean(alt) and clean(alt) in clean(pred):
            return True
    return False


def content_checks(pred: str, required: dict) -> list[bool]:
    """WebArena's reference contents: one check for exact_match, one per must_include item."""
    checks = []
    if "fuzzy_match" in required:
        raise ValueError("fuzzy_match needs an LLM judge, which this env does not use: write must_include instead")
    if "exact_match" in required:
        checks.append(exact_match(pred, required["exact_match"]))
    checks += [must_include(pred, item) for item in required.get("must_include", [])]
    if not checks:
        raise ValueError(f"reference contents name no check: {sorted(required)}")
    return checks


def url_match(url: str, reference: str) -> bool:
    """The final URL matches one reference: same path (trailing slash aside), the reference's query args present."""
    got = urlsplit(url)
    got_query = parse_qs(got.query)
    for ref in str(reference).split("|OR|"):
        want = urlsplit(expand(ref.strip()))
        if got.path.rstrip("/") != want.path.rstrip("/"):
            continue
        if all(got_query.get(k) == v for k, v in parse_qs(want.query).items()):
            return True
    return False


# ---------------------------------------------------------------- named database checks
DB_CHECKS: dict[str, Callable[..., str]] = {}


def db_check(fn: Callable[..., str]) -> Callable[..., str]:
    """Register `fn(db, **args) -> str` as the program_html locator `py:<name>`."""
    DB_CHECKS[fn.__name__] = fn
    return fn


def _value(db: sqlite3.Connection, sql: str, *args) -> str:
    row = db.execute(sql, args).fetchone()
    return "" if row is None or row[0] is None else str(row[0])


@db_check
def cart_qty(db, product_id: int) -> str:
    return _value(db, "SELECT qty FROM cart_items WHERE customer_id=? AND product_id=?", PERSONA_ID, product_id) or "0"


@db_check
def cart_qty_except(db, product_id: int) -> str:
    """The units in the cart of every product but one (a task that edits one line must leave the rest)."""
    return _value(
        db, "SELECT COALESCE(SUM(qty), 0) FROM cart_items WHERE customer_id=? AND product_id!=?", PERSONA_ID, product_id
    )


@db_check
def new_order_field(db, after: int, field: str) -> str:
    if field not in ("ship_name", "ship_street", "ship_city", "ship_zip", "shipping", "status"):
        raise ValueError(f"new_order_field: unknown field {field!r}")
    return _value(db, f"SELECT {field} FROM orders WHERE id>? AND customer_id=? ORDER BY id DESC", after, PERSONA_ID)


@db_check
def new_order_qty(db, after: int, product_id: int) -> str:
    return (
        _value(
            db,
            "SELECT i.qty FROM order_items i JOIN orders o ON o.id=i.order_id WHERE o.id>? AND "
            "o.customer_id=? AND i.product_id=? ORDER BY o.id DESC",
            after,
            PERSONA_ID,
            product_id,
        )
        or "0"
    )


@db_check
def order_status(db, order_id: int) -> str:
    return _value(db, "SELECT status FROM orders WHERE id=?", order_id)


@db_check
def product_field(db, product_id: int, field: str) -> str:
    if field == "price":
        return _value(db, "SELECT printf('%.2f', price_cents / 100.0) FROM products WHERE id=?", product_id)
    if field not in ("name", "stock", "enabled"):
        raise ValueError(f"product_field: unknown field {field!r}")
    return _value(db, f"SELECT {field} FROM products WHERE id=?", product_id)


@db_check
def my_review(db, product_id: int, field: str) -> str:
    if field not in ("title", "rating", "body"):
        raise ValueError(f"my_review: unknown field {field!r}")
    from esopt.envs.web.world import PERSONA_NAME

    return _value(
        db, f"SELECT {field} FROM reviews WHERE product_id=? AND author=? ORDER BY id DESC", product_id, PERSONA_NAME
    )


@db_check
def my_vote(db, kind: str, target: int) -> str:
    from esopt.envs.web.world import FORUM_USER

    return _value(db, "SELECT value FROM votes WHERE user=? AND kind=? AND target=?", FORUM_USER, kind, target) or "0"


@db_check
def my_comments(db, post_id: int) -> str:
    from esopt.envs.web.world import FORUM_USER

    return " | ".join(
        r[0]
        for r in db.execute("SELECT body FROM comments WHERE post_id=? AND author=? ORDER BY id", (post_id, FORUM_USER))
    )


@db_check
def my_post(db, title: str, field: str) -> str:
    from esopt.envs.web.world import FORUM_USER

    column = {"forum": "f.name", "body": "p.body"}.get(field)
    if column is None:
        raise ValueError(f"my_post: unknown field {field!r}")
    return _value(
        db,
        f"SELECT {column} FROM posts p JOIN forums f ON f.id=p.forum_id WHERE p.title=? AND p.author=?",
        title,
        FORUM_USER,
    )


@db_check
def wiki_fact(db, slug: str, key: str) -> str:
    return _value(
        db, "SELECT f.value FROM wiki_facts f JOIN wiki_pages p ON p.id=f.page_id WHERE p.slug=? AND f.key=?", slug, key
    )


@db_check
def wiki_page(db, title: str, field: str) -> str:
    if field not in ("category", "body"):
        raise ValueError(f"wiki_page: unknown field {field!r}")
    return _value(db, f"SELECT {field} FROM wiki_pages WHERE title=?", title)


# ---------------------------------------------------------------- scoring
@dataclass
class Evaluation:
    checks: list[tuple[str, bool]]

    @property
    def score(self) -> float:
        """WebArena's score: the product of every check (1 only if all pass)."""
        return float(all(ok for _, ok in self.checks))

    @property
    def shaped(self) -> float:
        return sum(ok for _, ok in self.checks) / len(self.checks) if self.checks else 0.0


def program_html_checks(
    entries: list[dict],
    last_url: str,
    last_html: str | bytes,
    fetch: Callable[[str], bytes],
    db: sqlite3.Connection | None,
) -> list[tuple[str, bool]]:
    checks = []
    for n, entry in enumerate(entries):
        locator = str(entry.get("locator", "")).strip()
        if locator.startswith("py:"):
            name = locator[3:]
            if name not in DB_CHECKS:
                raise ValueError(f"program_html: unknown database check {name!r}; known: {sorted(DB_CHECKS)}")
            got = DB_CHECKS[name](db, **entry.get("args", {})) if db is not None else ""
        else:
            url = entry.get("url", "last")
            html = last_html if url in ("last", "", None) else fetch(expand(str(url)))
            css = _QUERY_SELECTOR.match(locator)
            selector = css.group(2) if css else locator
            got = page_text(parse_page(html)) if not selector else (css_text(html, selector) or "")
        checks += [(f"program_html[{n}]", ok) for ok in content_checks(got, entry["required_contents"])]
    return checks


def evaluate(
    task: dict,
    answer: str | None,
    last_url: str,
    last_html: str | bytes = b"",
    fetch: Callable[[str], bytes] | None = None,
    db: sqlite3.Connection | None = None,
) -> Evaluation:
    """Score an end state: the agent's answer (None: it sent none), the final URL as a path on the sites (or any
    URL: only its path and query count), the final page, a fetcher of other pages and the episode's database."""
    spec = task["eval"]
    checks: list[tuple[str, bool]] = []
    for kind in spec["eval_types"]:
        if kind == "string_match":
            ok = content_checks(answer or "", spec["reference_answers"]) if answer is not None else [False]
            checks += [("string_match", x) for x in ok]
        elif kind == "url_match":
            checks.append(("url_match", url_match(last_url, spec["reference_url"])))
        elif kind == "program_html":
            checks += program_html_checks(spec["program_html"], last_url, last_html, fetch or (lambda url: b""), db)
        else:
            raise ValueError(f"unknown eval type {kind!r}: use string_match, url_match or program_html")
    return Evaluation(checks)
