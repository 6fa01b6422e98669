"""What every site's handlers share: Jinja2 rendering with the site's name and navigation, small sqlite helpers,
redirects after POST (303), and paging of long tables (?page=N, 25 rows).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse

PAGE_ROWS = 25
SITES = {
    "shop": ("One Stop Shop", (("Home", "/shop/"), ("My cart", "/shop/cart"), ("My orders", "/shop/orders"))),
    "admin": (
        "Shop Admin",
        (
            ("Dashboard", "/admin/"),
            ("Orders", "/admin/orders"),
            ("Customers", "/admin/customers"),
            ("Products", "/admin/products"),
            ("Reports", "/admin/reports"),
        ),
    ),
    "forum": ("Postmill", (("Forums", "/forum/"), ("Submit a post", "/forum/submit"))),
    "wiki": ("Wiki", (("Main page", "/wiki/"), ("Search", "/wiki/search"), ("Create a page", "/wiki/new"))),
}
_jinja = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=jinja2.ChainableUndefined,
)


def render(site: str, template: str, title: str, **context: Any) -> HTMLResponse:
    name, nav = SITES[site]
    html = _jinja.get_template(template).render(site_name=name, nav=nav, title=title, **context)
    return HTMLResponse(html)


def not_found(site: str, what: str) -> HTMLResponse:
    response = render(site, "table.html", "Page not found", lines=[f"{what} does not exist."])
    response.status_code = 404
    return response


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def rows(db: sqlite3.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in db.execute(sql, args)]


def one(db: sqlite3.Connection, sql: str, *args: Any) -> dict[str, Any] | None:
    r = db.execute(sql, args).fetchone()
    return dict(r) if r is not None else None


def to_int(text: Any, default: int | None = None) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return default


def paged(request: Request, items: list, base: str) -> tuple[list, list[tuple[str, str]]]:
    """One page of `items` (?page=N) and the links to the previous/next pages, other query arguments kept."""
    page = max(1, to_int(request.query_params.get("page"), 1) or 1)
    query = {k: v for k, v in request.query_params.items() if k != "page"}
    links = []
    if page > 1:
        links.append(("Previous page", f"{base}?{urlencode({**query, 'page': page - 1})}"))
    if page * PAGE_ROWS < len(items):
        links.append(("Next page", f"{base}?{urlencode({**query, 'page': page + 1})}"))
    return items[(page - 1) * PAGE_ROWS : page * PAGE_ROWS], links


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded POST body as a dict (the last value of a repeated name wins; bodies past 1 MB are cut).
    Parsed here, not with Starlette's `request.form()`, which needs python-multipart."""
    body = (await request.body())[:1_000_000].decode("utf-8", errors="replace")
    return dict(parse_qsl(body, keep_blank_values=True))
