"""HTML to a BrowserGym-style accessibility tree, flattened to text, without a browser.

`parse_page(html)` builds the tree lxml parses (HTML5-ish, forgiving: any bytes give some tree): every element
gets a `bid` in DOM order (0, 1, 2, ... like BrowserGym's `bid` attributes), roles and accessible names follow
Chromium's for the tags the sites use (link, button, textbox, combobox with its options, checkbox, heading, table
cells, landmarks), and text nodes become `StaticText`. `flatten(tree, state)` prints it the way BrowserGym's
`flatten_axtree_to_str` does with its defaults: one node a line, tab-indented by depth, `[bid] role 'name'`,
` value='...'` for fields, then properties (`checked='true'`, `selected=False`, `required`); unnamed `generic`
nodes are skipped (their children move up a level) and a `StaticText` whose text is in its parent's name is
dropped. `state` holds the live values of form fields (what `fill` and `select_option` changed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lxml.etree
import lxml.html

MAX_DEPTH = 120  # deeper elements are read as text only (fuzzed or hostile pages cannot blow the stack)
MAX_NAME = 200
SKIP_TAGS = {"script", "style", "head", "template", "noscript", "meta", "link", "base", "iframe", "object", "svg"}
TEXT_INPUTS = {"text", "search", "email", "url", "tel", "password", "date", "time", "datetime-local", "month", ""}
BUTTON_INPUTS = {"submit", "button", "reset", "image"}
NAME_FROM_CONTENT = {
    "link",
    "button",
    "heading",
    "cell",
    "columnheader",
    "rowheader",
    "option",
    "tab",
    "menuitem",
    "checkbox",
    "radio",
    "switch",
    "treeitem",
    "tooltip",
    "term",
}
TAG_ROLES = {
    "a": "generic",
    "button": "button",
    "textarea": "textbox",
    "h1": "heading",
    "h2": "heading",
    "h3": "heading",
    "h4": "heading",
    "h5": "heading",
    "h6": "heading",
    "p": "paragraph",
    "ul": "list",
    "ol": "list",
    "li": "listitem",
    "table": "table",
    "tr": "row",
    "td": "cell",
    "nav": "navigation",
    "main": "main",
    "header": "banner",
    "footer": "contentinfo",
    "article": "article",
    "aside": "complementary",
    "label": "LabelText",
    "option": "option",
    "dl": "DescriptionList",
    "dt": "term",
    "dd": "definition",
    "hr": "separator",
    "br": "LineBreak",
    "blockquote": "blockquote",
    "code": "code",
    "strong": "strong",
    "em": "emphasis",
    "figure": "figure",
    "caption": "caption",
    "img": "image",
    "progress": "progressbar",
    "thead": "rowgroup",
    "tbody": "rowgroup",
    "tfoot": "rowgroup",
    "dialog": "dialog",
    "menu": "list",
}


@dataclass
class Node:
    role: str
    name: str = ""
    bid: str | None = None
    el: Any = None  # the lxml element (None for text)
    children: list[Node] = field(default_factory=list)


@dataclass
class Page:
    """One parsed page: its tree, the element of every bid, and each label's target."""

    root: Node
    elements: dict[str, Any]
    title: str


def squash(text: str | None) -> str:
    return " ".join((text or "").split())


def parse_html(html: str | bytes) -> Any:
    """lxml's tree of any text (an empty or unparseable page is an empty <html>)."""
    try:
        doc = lxml.html.document_fromstring(html) if (html or "").strip() else None
    except (lxml.etree.ParserError, ValueError, TypeError):
        doc = None
    return doc if doc is not None else lxml.html.document_fromstring("<html><body></body></html>")


def is_hidden(el: Any) -> bool:
    style = (el.get("style") or "").replace(" ", "").lower()
    return (
        el.get("hidden") is not None
        or el.get("aria-hidden") == "true"
        or "display:none" in style
        or "visibility:hidden" in style
        or (el.tag == "input" and (el.get("type") or "").lower() == "hidden")
    )


def input_type(el: Any) -> str:
    return (el.get("type") or "text").strip().lower() if el.tag == "input" else ""


def role_of(el: Any) -> str:
    explicit = (el.get("role") or "").strip().split(" ")[0]
    if explicit:
        return explicit
    tag = el.tag
    if tag == "a":
        return "link" if el.get("href") is not None else "generic"
    if tag == "input":
        kind = input_type(el)
        if kind in BUTTON_INPUTS or kind == "file":
            return "button"
        return {
            "checkbox": "checkbox",
            "radio": "radio",
            "number": "spinbutton",
            "range": "slider",
            "search": "searchbox",
        }.get(kind, "textbox")
    if tag == "select":
        return "listbox" if el.get("multiple") is not None else "combobox"
    if tag == "th":
        row = el.getparent()
        return "rowheader" if row is not None and any(c.tag == "td" for c in row) else "columnheader"
    if tag == "form":
        return "form"
    if tag == "section":
        return "region" if el.get("aria-label") else "generic"
    return TAG_ROLES.get(tag, "generic")


def text_of(el: Any, limit: int | None = MAX_NAME, values: bool = False) -> str:
    """The visible text under an element (hidden and script subtrees left out), at most `limit` characters;
    `values`: with the values of the text fields inside (as in a name computed from content)."""
    parts: list[str] = []
    stack: list[Any] = [el]
    while stack and (limit is None or len(parts) < 4 * limit):
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
            continue
        if not isinstance(item.tag, str) or item.tag in SKIP_TAGS or is_hidden(item):
            if item.tail and item is not el:
                parts.append(item.tail)
            continue
        if item.tag == "input" and input_type(item) in BUTTON_INPUTS:
            parts.append(item.get("value") or "")
        elif values and item is not el and item.tag == "input" and input_type(item) not in ("checkbox", "radio"):
            parts.append(item.get("value") or "")  # Chromium counts a field's value in its container's name
        if item.tag == "img":
            parts.append(item.get("alt") or "")
        if item is not el and item.tail:
            stack.append(item.tail)
        stack.extend(reversed(list(item)))
        if item.text:
            stack.append(item.text)
    text = squash(" ".join(parts))
    return text if limit is None else text[:limit]


def name_of(el: Any, role: str, labels: dict[str, str], doc_ids: dict[str, Any]) -> str:
    if role == "generic":  # ARIA prohibits naming a generic element: Chromium drops its aria-label
        return ""
    aria = el.get("aria-label")
    if aria and aria.strip():
        return squash(aria)[:MAX_NAME]
    ref = el.get("aria-labelledby")
    if ref:
        found = [text_of(doc_ids[i]) for i in ref.split() if i in doc_ids]
        if any(found):
            return squash(" ".join(found))[:MAX_NAME]
    if el.tag in ("input", "select", "textarea"):
        if input_type(el) in BUTTON_INPUTS:
            return squash(
                el.get("value") or el.get("alt") or ("Submit" if input_type(el) in ("submit", "image") else "")
            )
        label = labels.get(el.get("id") or "\x00") or _wrapping_label(el)
        if label:
            return label
        return squash(el.get("title") or el.get("placeholder") or "")[:MAX_NAME]
    if el.tag == "img":
        return squash(el.get("alt") or el.get("title") or "")[:MAX_NAME]
    if role in NAME_FROM_CONTENT:
        return text_of(el, values=True) or squash(el.get("title") or "")[:MAX_NAME]
    return squash(el.get("title") or "")[:MAX_NAME]


def _wrapping_label(el: Any) -> str:
    parent = el.getparent()
    for _ in range(MAX_DEPTH):
        if parent is None:
            return ""
        if parent.tag == "label":
            return text_of(parent)
        parent = parent.getparent()
    return ""


def _insert_tbody(doc: Any) -> None:
    """Wrap the rows that sit directly in a <table> in a <tbody>, as an HTML5 parser (Chromium's) does; lxml's
    parser does not, and the extra element shifts the bids that follow it."""
    for table in list(doc.iter("table")):
        rows = [c for c in table if c.tag == "tr"]
        if rows:
            body = lxml.html.Element("tbody")
            table.insert(table.index(rows[0]), body)
            for row in rows:
                body.append(row)  # moves it (an lxml element has one parent)


def parse_page(html: str | bytes) -> Page:
    """The accessibility tree of a page; bids are assigned to every element, in document order."""
    doc = parse_html(html)
    _insert_tbody(doc)
    if doc.find("head") is None:  # an HTML5 parser always makes a <head>; its bid shifts the rest
        doc.insert(0, lxml.html.Element("head"))
    elements: dict[str, Any] = {}
    doc_ids: dict[str, Any] = {}
    for n, el in enumerate(e for e in doc.iter() if isinstance(e.tag, str)):
        elements[str(n)] = el
        el_id = el.get("id")
        if el_id and el_id not in doc_ids:
            doc_ids[el_id] = el
    bids = {id(el): bid for bid, el in elements.items()}
    labels = {lab.get("for"): text_of(lab) for lab in doc.iter("label") if lab.get("for")}
    title = squash(doc.findtext(".//title"))[:MAX_NAME]
    root = Node("RootWebArea", title)
    body = doc.find("body")
    _add_children(root, body if body is not None else doc, bids, labels, doc_ids, 0)
    return Page(root, elements, title)


def _add_children(node: Node, el: Any, bids: dict, labels: dict, doc_ids: dict, depth: int) -> None:
    if el.text:
        _add_text(node, el.text)
    for child in el:
        if isinstance(child.tag, str) and child.tag not in SKIP_TAGS and not is_hidden(child):
            if depth >= MAX_DEPTH:
                _add_text(node, text_of(child))
            else:
                role = role_of(child)
                sub = Node(role, name_of(child, role, labels, doc_ids), bids.get(id(child)), child)
                node.children.append(sub)
                if child.tag == "li" and el.tag in ("ul", "ol"):  # Chromium's list bullet or number
                    number = sum(1 for c in el if c.tag == "li" and c.getparent() is el and _before(c, child)) + 1
                    sub.children.append(Node("ListMarker", "\u2022" if el.tag == "ul" else f"{number}. "))
                if child.tag == "select":  # Chromium puts the options in a popup node
                    popup = Node("MenuListPopup", "")
                    sub.children.append(popup)
                    _add_children(popup, child, bids, labels, doc_ids, depth + 1)
                elif child.tag not in ("input", "textarea"):
                    _add_children(sub, child, bids, labels, doc_ids, depth + 1)
        if child.tail:
            _add_text(node, child.tail)


def _before(a: Any, b: Any) -> bool:
    parent = b.getparent()
    return parent is not None and parent.index(a) < parent.index(b)


def _add_text(node: Node, text: str) -> None:
    text = squash(text)
    if text:
        node.children.append(Node("StaticText", text[: MAX_NAME * 2]))


# ---------------------------------------------------------------- flattening
def field_value(el: Any, state: dict[str, Any], bid: str) -> str | None:
    """The value shown for a form field: the live one if the agent changed it, else the page's."""
    if el.tag == "textarea":
        return str(state.get(bid, el.text or ""))
    if el.tag == "input" and role_of(el) in ("textbox", "searchbox", "spinbutton"):
        return str(state.get(bid, el.get("value") or ""))
    if el.tag == "select":
        chosen = selected_option(el, state, bid)
        return text_of(chosen) if chosen is not None else ""
    return None


def options_of(select: Any) -> list[Any]:
    return [o for o in select.iter("option")]


def selected_option(select: Any, state: dict[str, Any], bid: str) -> Any:
    options = options_of(select)
    if bid in state:
        index = state[bid]
        return options[index] if isinstance(index, int) and 0 <= index < len(options) else None
    marked = [o for o in options if o.get("selected") is not None]
    return marked[-1] if marked else (options[0] if options else None)


def is_checked(el: Any, state: dict[str, Any], bid: str) -> bool:
    return bool(state.get(bid, el.get("checked") is not None))


def properties(node: Node, state: dict[str, Any], select_of: dict[int, tuple[Any, str]]) -> list[str]:
    el, bid, props = node.el, node.bid or "", []
    if node.role in ("checkbox", "radio", "switch") and el.tag == "input":
        props.append(f"checked={'true' if is_checked(el, state, bid) else 'false'!r}")
    if node.role == "option" and el.tag == "option":
        owner = select_of.get(id(el))
        chosen = selected_option(owner[0], state, owner[1]) if owner else None
        props.append(f"selected={chosen is el}")
    if node.role == "combobox" and el.tag == "select":
        props += ["hasPopup='menu'", "expanded=False"]
    if node.role == "separator" and el.tag == "hr":
        props.append("orientation='horizontal'")
    if el is not None and el.get("disabled") is not None:
        props.append("disabled=True")
    if el is not None and el.get("required") is not None:
        props.append("required")
    return props


def _number(text: Any) -> int | float | None:
    try:
        value = float(str(text).strip())
    except ValueError:
        return None
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _field(node: Node, state: dict[str, Any]) -> tuple[str, list[str], str | None]:
    """How Chromium shows a form field: (the ` value=...` part, extra properties, the text of the StaticText child
    that its inner editor adds, if any)."""
    value = field_value(node.el, state, node.bid or "") if node.el is not None else None
    if value is None:
        return "", [], None
    if node.role == "spinbutton":
        number = _number(value)
        bounds = [f"valuemin={_number(node.el.get('min')) or 0}", f"valuemax={_number(node.el.get('max')) or 0}"]
        return (f" value={number!r}" if number is not None else ""), [*bounds, f"valuetext={value!r}"], value or None
    if node.role in ("textbox", "searchbox"):
        return (f" value={value!r}" if value else ""), [], value or None
    return f" value={value!r}", [], None


def flatten(page: Page, state: dict[str, Any] | None = None) -> list[str]:
    """The page as BrowserGym's `flatten_axtree_to_str` prints it (its defaults), one list item per line."""
    state = state or {}
    select_of = {
        id(o): (sel, bid) for bid, sel in page.elements.items() if sel.tag == "select" for o in options_of(sel)
    }
    lines: list[str] = []
    stack: list[tuple[Node, int, str]] = [(page.root, 0, "")]
    while stack:
        node, depth, parent_name = stack.pop()
        skip = node.role in ("LineBreak", "none") or (node.role == "generic" and not node.name)
        if node.role == "StaticText" and node.name in parent_name:
            skip = True
        children = list(node.children)
        if not skip:
            text = f"{node.role} {node.name.strip()!r}"
            if node.bid is not None:
                text = f"[{node.bid}] {text}"
            value, props, inner = _field(node, state)
            if node.role == "RootWebArea":
                props = ["focused"]
            elif node.el is not None:
                props += properties(node, state, select_of)
            if inner is not None:  # the field's inner editor: an unnamed generic holding the text
                children.insert(0, Node("generic", "", children=[Node("StaticText", inner)]))
            lines.append("\t" * depth + text + value + "".join(", " + p for p in props))
        child_depth = depth if skip else depth + 1
        stack.extend((child, child_depth, node.name) for child in reversed(children))
    return lines


def page_text(page: Page) -> str:
    """All visible text of a page (what an evaluator's empty locator reads)."""
    return text_of(page.elements["0"], limit=None) if "0" in page.elements else ""


def css_text(html: str | bytes, selector: str) -> str | None:
    """The visible text of the elements matching a CSS selector, joined by spaces (None: the selector is bad)."""
    from lxml.cssselect import CSSSelector

    try:
        match = CSSSelector(selector)
    except Exception:  # cssselect raises several kinds of errors for a bad selector
        return None
    return " ".join(text_of(el, limit=None) for el in match(parse_html(html)))
