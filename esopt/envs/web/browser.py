"""A text browser for the agent: httpx for the requests, lxml for the pages, BrowserGym's observation and actions.

It keeps what a real browser would: the current page and its form fields' live values (`fill`, `select_option`,
`check` change them; a submit sends them, GET or POST as the form says), a back/forward history, cookies (the
episode's), and a scroll position, which here pages the flattened tree so that one observation stays within
`page_chars` characters (about 400 tokens at the default). URLs are shown with a fixed display origin
(`http://localhost`), so observations do not depend on the server's port; `goto` takes either origin or a path,
and only this server's sites (never its /_esopt control routes). A failed action leaves the page as it was and is
reported as the observation's `Error:` line, BrowserGym's `last_action_error`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

import httpx

from esopt.envs.web.actions import Action
from esopt.envs.web.axtree import (
    BUTTON_INPUTS,
    Page,
    flatten,
    input_type,
    is_checked,
    options_of,
    parse_page,
    role_of,
    selected_option,
    squash,
    text_of,
)

DISPLAY_ORIGIN = "http://localhost"
MAX_PAGE_BYTES = 2_000_000
MAX_LINE = 300
MAX_FILL = 2000
TEXT_ROLES = {"textbox", "searchbox", "spinbutton"}


class BrowserError(Exception):
    """An action that cannot be done (its message is the observation's error line)."""


class TextBrowser:
    def __init__(self, origin: str, page_chars: int = 1200, timeout: float = 10.0) -> None:
        self.origin = origin.rstrip("/")
        self.page_chars = int(page_chars)
        self.client = httpx.Client(follow_redirects=True, timeout=timeout, max_redirects=5)
        self.url = ""
        self.html = ""
        self.page: Page = parse_page("")
        self.lines: list[str] = []
        self.state: dict[str, Any] = {}
        self.scroll = 0
        self.back: list[str] = []
        self.forward: list[str] = []
        self.last_error = ""

    def close(self) -> None:
        self.client.close()

    # -------------------------------------------------------------- urls
    def display(self, url: str) -> str:
        return DISPLAY_ORIGIN + url[len(self.origin) :] if url.startswith(self.origin) else url

    def resolve(self, url: str) -> str:
        """A URL the agent wrote as a real one on this server; BrowserError if it leaves the server."""
        url = squash(str(url))[:2000]
        if url.startswith(DISPLAY_ORIGIN) and url[len(DISPLAY_ORIGIN) :][:1] in ("", "/", "?"):
            url = self.origin + url[len(DISPLAY_ORIGIN) :]
        full = urljoin(self.url or self.origin + "/", url)
        parts = urlsplit(full)
        if urlsplit(self.origin).netloc != parts.netloc or parts.scheme != "http" or parts.path.startswith("/_esopt"):
            raise BrowserError(f"only the sites on this server can be opened, e.g. {DISPLAY_ORIGIN}/shop/")
        return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))

    # -------------------------------------------------------------- loading
    def load(self, url: str, method: str = "GET", data: dict[str, str] | None = None, record: bool = True) -> None:
        """Fetch a page (following redirects) and make it current; BrowserError on a network failure."""
        try:
            if method == "POST":
                response = self.client.post(url, data=data or {})
            else:
                response = self.client.get(url)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as e:
            raise BrowserError(f"could not load {self.display(url)}: {type(e).__name__}") from None
        if record and self.url:
            self.back.append(self.url)
            self.forward.clear()
        self.show(str(response.url), response.content[:MAX_PAGE_BYTES])

    def show(self, url: str, html: str | bytes) -> None:
        """Make `html` the current page at `url` (fresh field values, scrolled to the top)."""
        self.url, self.html = url, html
        self.page = parse_page(html)
        self.state, self.scroll = {}, 0
        self._layout()

    def _layout(self) -> None:
        """The page's lines: BrowserGym's flattening with one space per level instead of a tab (observations are
        printable ASCII and newlines), long lines cut."""
        lines = []
        for line in flatten(self.page, self.state):
            body = line.lstrip("\t")
            line = " " * (len(line) - len(body)) + body
            lines.append(line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "...")
        self.lines = lines

    def chunks(self) -> list[list[str]]:
        """The flattened page cut into screens of at most `page_chars` characters."""
        out: list[list[str]] = [[]]
        size = 0
        for line in self.lines:
            if out[-1] and size + len(line) + 1 > self.page_chars:
                out.append([])
                size = 0
            out[-1].append(line)
            size += len(line) + 1
        return out

    def observation(self) -> str:
        screens = self.chunks()
        self.scroll = min(self.scroll, len(screens) - 1)
        head = [f"URL: {self.display(self.url)}"]
        if self.last_error:
            head.append(f"Error: {self.last_error}")
        body = screens[self.scroll]
        if len(screens) > 1:
            more = (
                "scroll(0, 300) shows more"
                if self.scroll < len(screens) - 1
                else "end of page; scroll(0, -300) goes up"
            )
            head.append(f"(screen {self.scroll + 1} of {len(screens)}: {more})")
        return "\n".join(head + body)

    # -------------------------------------------------------------- actions
    def act(self, action: Action) -> None:
        """Do one action; sets `last_error` to '' or to why it failed (the page then stays as it was)."""
        self.last_error = ""
        try:
            getattr(self, "_do_" + action.name, self._unsupported)(action)
        except BrowserError as e:
            self.last_error = str(e)[:300]

    def _unsupported(self, action: Action) -> None:
        raise BrowserError(f"{action.name} is not available in this browser")

    def element(self, bid: str) -> Any:
        el = self.page.elements.get(str(bid))
        if el is None:
            raise BrowserError(f"no element with bid {bid!r} on this page")
        return el

    def _do_noop(self, action: Action) -> None:
        pass

    def _do_focus(self, action: Action) -> None:
        self.element(action.args["bid"])

    _do_hover = _do_focus

    def _do_scroll(self, action: Action) -> None:
        dy = action.args["delta_y"]
        last = len(self.chunks()) - 1
        if dy > 0 and self.scroll >= last or dy < 0 and self.scroll == 0:
            raise BrowserError("already at the " + ("end" if dy > 0 else "top") + " of the page")
        self.scroll = max(0, min(last, self.scroll + (1 if dy > 0 else -1 if dy < 0 else 0)))

    def _do_go_back(self, action: Action) -> None:
        if not self.back:
            raise BrowserError("no previous page")
        current = self.url
        self.load(self.back.pop(), record=False)
        self.forward.append(current)

    def _do_go_forward(self, action: Action) -> None:
        if not self.forward:
            raise BrowserError("no next page")
        current = self.url
        self.load(self.forward.pop(), record=False)
        self.back.append(current)

    def _do_goto(self, action: Action) -> None:
        self.load(self.resolve(action.args["url"]))

    def _do_fill(self, action: Action) -> None:
        bid = action.args["bid"]
        el = self.element(bid)
        if not (el.tag == "textarea" or (el.tag == "input" and role_of(el) in TEXT_ROLES)):
            raise BrowserError(
                f"element {bid} is a {role_of(el)}, not a text field"
                + ("; use select_option" if el.tag == "select" else "")
            )
        self._editable(el, bid)
        self.state[bid] = str(action.args["value"])[:MAX_FILL]
        self._layout()

    def _do_clear(self, action: Action) -> None:
        self._do_fill(Action("fill", {"bid": action.args["bid"], "value": ""}))

    def _editable(self, el: Any, bid: str) -> None:
        if el.get("disabled") is not None or el.get("readonly") is not None:
            raise BrowserError(f"element {bid} is disabled")

    def _do_select_option(self, action: Action) -> None:
        bid = action.args["bid"]
        el = self.element(bid)
        if el.tag != "select":
            raise BrowserError(f"element {bid} is a {role_of(el)}, not a combobox (a select)")
        self._editable(el, bid)
        options = options_of(el)
        wanted = action.args["options"][0]
        for match in (
            lambda o: (o.get("value") or text_of(o)) == wanted,
            lambda o: text_of(o) == wanted,
            lambda o: text_of(o).lower().startswith(squash(wanted).lower()) and squash(wanted) != "",
        ):
            index = next((i for i, o in enumerate(options) if match(o)), None)
            if index is not None:
                self.state[bid] = index
                self._layout()
                return
        names = ", ".join(repr(text_of(o)) for o in options[:12])
        raise BrowserError(f"no option {wanted[:60]!r} in element {bid}; its options: {names or 'none'}")

    def _do_check(self, action: Action, value: bool = True) -> None:
        bid = action.args["bid"]
        el = self.element(bid)
        if role_of(el) not in ("checkbox", "radio") or el.tag != "input":
            raise BrowserError(f"element {bid} is a {role_of(el)}, not a checkbox")
        self._editable(el, bid)
        self._set_checked(el, bid, value)

    def _do_uncheck(self, action: Action) -> None:
        self._do_check(action, value=False)

    def _set_checked(self, el: Any, bid: str, value: bool) -> None:
        if input_type(el) == "radio" and value:
            form = self._form_of(el)
            for other_bid, other in self.page.elements.items():
                if (
                    other.tag == "input"
                    and input_type(other) == "radio"
                    and other.get("name") == el.get("name")
                    and self._form_of(other) is form
                ):
                    self.state[other_bid] = False
        self.state[bid] = value
        self._layout()

    def _do_press(self, action: Action) -> None:
        bid, key = action.args["bid"], action.args["key_comb"].strip()
        el = self.element(bid)
        if key.lower() == "enter" and el.tag == "input" and role_of(el) in TEXT_ROLES:
            form = self._form_of(el)
            if form is not None:
                self.submit(form, None)

    def _do_dblclick(self, action: Action) -> None:
        self._do_click(action)

    def _do_click(self, action: Action) -> None:
        bid = action.args["bid"]
        el = self.element(bid)
        if el.get("disabled") is not None:
            raise BrowserError(f"element {bid} is disabled")
        if el.tag == "label":
            target = (
                self.page_element_by_id(el.get("for"))
                if el.get("for")
                else next((c for c in el.iter("input", "select", "textarea") if c is not el), None)
            )
            if target is not None and target.tag == "input" and input_type(target) in ("checkbox", "radio"):
                el = target
                bid = self.bid_of(target)
        if el.tag == "input" and input_type(el) in ("checkbox", "radio"):
            self._set_checked(el, bid, not is_checked(el, self.state, bid) or input_type(el) == "radio")
            return
        if el.tag == "option":
            select = next((a for a in el.iterancestors("select")), None)
            if select is not None:
                self.state[self.bid_of(select)] = options_of(select).index(el)
                self._layout()
            return
        link = next((a for a in [el, *el.iterancestors()] if a.tag == "a" and a.get("href") is not None), None)
        if link is not None:
            href = link.get("href").strip()
            if href.startswith(("javascript:", "mailto:")):
                raise BrowserError("this link runs a script: not supported")
            if href.startswith("#"):
                return
            self.load(self.resolve(href))
            return
        if self._is_submit(el):
            form = self._form_of(el)
            if form is not None:
                self.submit(form, el)

    def _is_submit(self, el: Any) -> bool:
        if el.tag == "button":
            return (el.get("type") or "submit").lower() == "submit"
        return el.tag == "input" and input_type(el) in ("submit", "image")

    def bid_of(self, el: Any) -> str:
        return next(b for b, e in self.page.elements.items() if e is el)

    def page_element_by_id(self, el_id: str) -> Any:
        return next((e for e in self.page.elements.values() if e.get("id") == el_id), None)

    def _form_of(self, el: Any) -> Any:
        owner = el.get("form")
        if owner:
            found = self.page_element_by_id(owner)
            if found is not None and found.tag == "form":
                return found
        return next((a for a in el.iterancestors("form")), None)

    # -------------------------------------------------------------- forms
    def form_data(self, form: Any, submitter: Any) -> list[tuple[str, str]]:
        """The (name, value) pairs a browser sends for `form`, in document order, with the live field values."""
        data = []
        for bid, el in self.page.elements.items():
            name = el.get("name")
            if el.tag not in ("input", "select", "textarea", "button") or not name or el.get("disabled") is not None:
                continue
            if self._form_of(el) is not form:
                continue
            kind = input_type(el)
            if el.tag == "button" or (el.tag == "input" and kind in BUTTON_INPUTS):
                if el is submitter:
                    data.append((name, el.get("value") or ""))
            elif el.tag == "input" and kind in ("checkbox", "radio"):
                if is_checked(el, self.state, bid):
                    data.append((name, el.get("value") or "on"))
            elif el.tag == "select":
                chosen = selected_option(el, self.state, bid)
                if chosen is not None:
                    data.append((name, chosen.get("value") if chosen.get("value") is not None else text_of(chosen)))
            elif el.tag == "textarea":
                data.append((name, str(self.state.get(bid, el.text or ""))))
            elif kind != "file":
                data.append((name, str(self.state.get(bid, el.get("value") or ""))))
        return data

    def submit(self, form: Any, submitter: Any) -> None:
        data = self.form_data(form, submitter)
        target = self.resolve(
            (submitter.get("formaction") if submitter is not None else None) or form.get("action") or self.url
        )
        if (form.get("method") or "get").lower() == "post":
            self.load(target, method="POST", data=dict(data))
        else:
            parts = urlsplit(target)
            self.load(urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(data), "")))

    # -------------------------------------------------------------- for oracles and tests
    def find(self, role: str, name: str, near: str | None = None, exact: bool = True) -> str:
        """The bid of the element with this role and accessible name (within a row, list item, article or form whose
        text contains `near`, if given); BrowserError if there is none."""
        from esopt.envs.web.axtree import Node

        stack: list[Node] = [self.page.root]
        while stack:
            node = stack.pop()
            stack.extend(reversed(node.children))
            if node.bid is None or node.role != role:
                continue
            if (node.name != name) if exact else (name.lower() not in node.name.lower()):
                continue
            if near is None or any(
                near in text_of(a, limit=None) for a in node.el.iterancestors("tr", "li", "article", "form")
            ):
                return node.bid
        raise BrowserError(
            f"no {role} named {name!r}" + (f" near {near!r}" if near else "") + f" on {self.display(self.url)}"
        )
