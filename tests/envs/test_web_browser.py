"""Parity of the text browser with BrowserGym in a real Chromium: the same page, flattened by our `axtree` and by
BrowserGym's `flatten_axtree_to_str` over Chromium's accessibility tree, gives the same text, bids included (modulo
the root's `url=` property and the roles BrowserGym's users ignore: LineBreak, Chromium 156's InlineTextBox). The
sites use no <ol>: Chromium 156 numbers the markers of a page set with `set_content` from 0.

Runs where `make` installed the `web-browser` extra (browsergym-core, playwright) and Debian's
chromium-headless-shell; skipped elsewhere."""

from __future__ import annotations

import shutil

import psutil
import pytest

pytest.importorskip("browsergym.core.observation")
from playwright.sync_api import sync_playwright  # noqa: E402

from esopt.envs.web.axtree import flatten, parse_page  # noqa: E402
from esopt.envs.web.env import WebEnv  # noqa: E402
from esopt.envs.web.miniwob import browsergym_tree  # noqa: E402

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Debian chromium: `make` installs chromium-headless-shell")
PAGES = ["/shop/product/3", "/shop/cart", "/shop/checkout", "/admin/orders", "/admin/product/3/edit", "/admin/reports",
         "/forum/f/cooking", "/forum/post/3", "/wiki/page/folaria"]  # every page template, each with forms or tables
SYNTHETIC = [
    "<title>t</title><ul><li>one</li><li><a href='/x'>two</a></li></ul><p>Hello <b>bold</b> world</p>",
    "<form><label>Agree <input type='checkbox' name='a'></label><input type='radio' name='r' checked>"
    "<textarea name='t'>some text</textarea><select name='s'><option>A</option><option selected>B</option></select>"
    "<input type='submit' value='Go'><button disabled>Off</button></form>",
    "<table><tr><th>k</th><td>v</td></tr><tr><td><a href='/y'>link</a></td><td><input value='3'></td></tr></table>"
    "<img alt='a cat'><img alt=''><div hidden>gone</div><span aria-label='named'>x</span><h2>Head</h2><hr>",
]


def chromium_processes() -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True) if "chrom" in c.name().lower()]


@pytest.fixture(scope="module")
def chromium():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        started = chromium_processes()
        assert started
        yield browser
        browser.close()
    _, alive = psutil.wait_procs(started, timeout=30)  # returns as soon as every Chromium process has exited
    assert not browser.is_connected() and not alive


def browsergym_text(browser, html: str) -> str:
    page = browser.new_page()
    try:
        page.set_content(html)
        return browsergym_tree(page)
    finally:
        page.close()


def test_text_browser_matches_browsergym_on_every_site(chromium):
    env = WebEnv(split="all")
    try:
        env.reset(seed=0)
        for path in PAGES:
            html = env.browser.client.get(env.browser.origin + path).text
            assert "\n".join(flatten(parse_page(html))) == browsergym_text(chromium, html), path
    finally:
        env.close()


@pytest.mark.parametrize("html", SYNTHETIC)
def test_text_browser_matches_browsergym_on_form_and_table_markup(chromium, html):
    assert "\n".join(flatten(parse_page(html))) == browsergym_text(chromium, html)
