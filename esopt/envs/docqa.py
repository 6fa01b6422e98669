"""`esopt/DocQA-v0`: questions about document page images, answered by a ReAct agent with OCR tools.

Each seed makes one document (an invoice, a receipt, an order form or a price table) with known field
values, renders it to page images with PIL, and asks one question about it with a gold answer:
a lookup ("What is the invoice number?"), a sum of two line items, or a comparison ("Which costs more?").

Tools (the page images are never shown; the model reads them through OCR):
- `ocr(page)`: tesseract's text of a page, lines numbered;
- `find(text)`: the lines of any page that contain `text` (case-insensitive);
- `read(page, start, end)`: lines start..end of a page's OCR text.

OCR runs `tesseract` through `pytesseract` (installed by `make`); a page's text is cached per document, so
the members of a population that read the same page pay for it once. Scores: ANLS (the DocVQA metric) is the
shaped reward, exact match is success.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from esopt.envs.tools.answers import anls, exact_match
from esopt.envs.tools.protocol import Tool
from esopt.envs.tools.react import ToolEnv

KINDS = ("invoice", "receipt", "order form", "price table")
QUESTION_KINDS = ("lookup", "sum", "compare")
VENDORS = ("Acme Supplies", "Northwind Traders", "Blue Harbor Ltd", "Globex Partners", "Maple & Stone",
           "Orion Office Co", "Riverbend Farms", "Summit Tools")
CUSTOMERS = ("Dana Whitfield", "Lee Okafor", "Priya Raman", "Tom Becker", "Ana Souza", "Kenji Mori")
ITEMS = ("Paper ream", "Stapler", "Desk lamp", "Ink cartridge", "Notebook", "USB cable", "Monitor stand",
         "Chair mat", "Whiteboard", "Marker set", "Coffee beans", "Water filter", "Extension cord", "Label tape")
PAGE_SIZE = (1000, 1300)
ITEMS_PER_PAGE = 12


@dataclass(frozen=True)
class Document:
    seed: int
    kind: str
    fields: tuple[tuple[str, str], ...]  # (label, value) in page order
    items: tuple[tuple[str, int, float], ...]  # (description, quantity, unit price)

    def amount(self, i: int) -> float:
        _, qty, price = self.items[i]
        return round(qty * price, 2)

    @property
    def total(self) -> float:
        return round(sum(self.amount(i) for i in range(len(self.items))), 2)

    @property
    def pages(self) -> int:
        return 1 + max(0, len(self.items) - 1) // ITEMS_PER_PAGE


def money(x: float) -> str:
    return f"{x:,.2f}"


def make_document(seed: int, max_items: int = 8) -> Document:
    rng = np.random.default_rng([seed, 17])
    kind = KINDS[int(rng.integers(len(KINDS)))]
    number = f"{kind[:3].upper()}-{int(rng.integers(1000, 9999))}"
    date = f"2026-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"
    fields = [("Number", number), ("Date", date), ("Vendor", VENDORS[int(rng.integers(len(VENDORS)))]),
              ("Customer", CUSTOMERS[int(rng.integers(len(CUSTOMERS)))])]
    n = int(rng.integers(3, max_items + 1))
    names = [ITEMS[i] for i in rng.choice(len(ITEMS), size=n, replace=False)]
    items = tuple((name, int(rng.integers(1, 10)), round(float(rng.integers(100, 20000)) / 100, 2)) for name in names)
    return Document(seed, kind, tuple(fields), items)


def page_lines(doc: Document, page: int) -> list[str]:
    """The text lines printed on `page` (1-based): the ground truth that OCR reads back."""
    lines = []
    if page == 1:
        lines.append(doc.kind.upper())
        lines += [f"{label}: {value}" for label, value in doc.fields]
        lines.append("")
    lines.append("Item | Qty | Unit price | Amount")
    first = (page - 1) * ITEMS_PER_PAGE
    for i in range(first, min(first + ITEMS_PER_PAGE, len(doc.items))):
        name, qty, price = doc.items[i]
        lines.append(f"{name} | {qty} | {money(price)} | {money(doc.amount(i))}")
    if page == doc.pages:
        lines += ["", f"Total: {money(doc.total)}"]
    return lines


def render_page(doc: Document, page: int):
    """A PIL image of the page: black text on white, PIL's built-in scalable font (no system fonts needed)."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", PAGE_SIZE, 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=28)
    y = 60
    for line in page_lines(doc, page):
        draw.text((60, y), line, fill=0, font=font)
        y += 44
    return image


_OCR_LOCKS = [threading.Lock() for _ in range(64)]  # one page's concurrent readers wait for one OCR run


def ocr_lines(seed: int, max_items: int, page: int) -> tuple[str, ...]:
    """Tesseract's lines of one page. Cached (documents are pure functions of their seed), and the members of a
    population that ask for the same page at the same time share one run."""
    with _OCR_LOCKS[hash((seed, max_items, page)) % len(_OCR_LOCKS)]:
        return _ocr_lines(seed, max_items, page)


@functools.lru_cache(maxsize=4096)
def _ocr_lines(seed: int, max_items: int, page: int) -> tuple[str, ...]:
    import pytesseract

    text = pytesseract.image_to_string(render_page(make_document(seed, max_items), page), config="--psm 6",
                                       timeout=30)
    return tuple(line.strip() for line in text.splitlines() if line.strip())


@dataclass(frozen=True)
class Question:
    kind: str
    text: str
    answers: tuple[str, ...]


def make_question(doc: Document, seed: int, kinds: tuple[str, ...] = QUESTION_KINDS) -> Question:
    rng = np.random.default_rng([seed, 23])
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "lookup":
        options = [*doc.fields, ("Total", money(doc.total))]
        label, value = options[int(rng.integers(len(options)))]
        answers = (value, value.replace(",", "")) if label == "Total" else (value,)
        return Question(kind, f"What is the {label.lower()} on this {doc.kind}?", answers)
    i, j = (int(x) for x in rng.choice(len(doc.items), size=2, replace=False))
    a, b = doc.items[i][0], doc.items[j][0]
    if kind == "sum":
        value = money(doc.amount(i) + doc.amount(j))
        return Question(kind, f"What is the sum of the amounts of {a} and {b}?", (value, value.replace(",", "")))
    if doc.amount(i) == doc.amount(j):
        j = (i + 1) % len(doc.items)
        b = doc.items[j][0]
    winner = a if doc.amount(i) > doc.amount(j) else b
    return Question(kind, f"Which line has the larger amount: {a} or {b}?", (winner,))


class DocQAEnv(ToolEnv):
    task_intro = ("Answer the question about a document. You cannot see its pages: read them with the tools. "
                  "Answer with the value exactly as the document writes it.")

    def __init__(self, max_turns: int = 5, call_format: str = "tagged", observation_chars: int = 800,
                 max_items: int = 8, questions: tuple[str, ...] | list[str] = QUESTION_KINDS,
                 render_mode: str | None = None) -> None:
        if isinstance(max_items, bool) or not isinstance(max_items, int) or not 3 <= max_items <= 40:
            raise ValueError(f"max_items must be an integer in [3, 40], got {max_items!r}")
        bad = [q for q in questions if q not in QUESTION_KINDS]
        if bad or not questions:
            raise ValueError(f"questions must be a non-empty subset of {list(QUESTION_KINDS)}, got {list(questions)!r}")
        self.max_items, self.question_kinds = max_items, tuple(questions)
        self.question: Question | None = None
        super().__init__(max_turns=max_turns, call_format=call_format, observation_chars=observation_chars,
                         render_mode=render_mode)

    def _make_tools(self) -> dict[str, Tool]:
        page = {"type": "integer", "description": "page number, from 1"}
        return {
            "ocr": Tool("ocr", "the text of a page, lines numbered", {"type": "object", "properties": {"page": page},
                        "required": ["page"]}, self._ocr, time_limit=30.0),
            "find": Tool("find", "the numbered lines of any page that contain the text",
                         {"type": "object", "properties": {"text": {"type": "string", "description": "text to find"}},
                          "required": ["text"]}, self._find, time_limit=30.0),
            "read": Tool("read", "lines start to end of a page",
                         {"type": "object", "properties": {"page": page, "start": {"type": "integer"},
                                                           "end": {"type": "integer"}},
                          "required": ["page", "start", "end"]}, self._read, time_limit=30.0),
        }

    def _new_task(self, seed: int, options: Mapping[str, Any] | None) -> tuple[Document, str]:
        document = make_document(seed, self.max_items)
        self.question = make_question(document, seed, self.question_kinds)
        pages = document.pages
        return document, f"Document: {pages} page{'s' if pages > 1 else ''}. Question: {self.question.text}"

    def _grade(self, answer: str) -> tuple[bool, float]:
        return exact_match(answer, list(self.question.answers)), anls(answer, list(self.question.answers))

    @property
    def document(self) -> Document | None:
        """The current episode's document (the task)."""
        return self._task

    def _lines(self, page: int) -> tuple[str, ...]:
        if not 1 <= page <= self.document.pages:
            raise ValueError(f"page {page} does not exist; the document has {self.document.pages}")
        return ocr_lines(self.document.seed, self.max_items, page)

    def _ocr(self, page: int) -> str:
        return "\n".join(f"{n}: {line}" for n, line in enumerate(self._lines(page), 1))

    def _find(self, text: str) -> str:
        needle = text.strip().lower()
        if not needle:
            raise ValueError("find needs some text")
        hits = [f"page {p} line {n}: {line}" for p in range(1, self.document.pages + 1)
                for n, line in enumerate(self._lines(p), 1) if needle in line.lower()]
        return "\n".join(hits) if hits else f"no line contains {text.strip()[:40]!r}"

    def _read(self, page: int, start: int, end: int) -> str:
        lines = self._lines(page)
        start, end = max(1, start), min(len(lines), end)
        if start > end:
            return f"no lines there: page {page} has lines 1-{len(lines)}"
        return "\n".join(f"{n}: {lines[n - 1]}" for n in range(start, end + 1))

    def worked_examples(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        """A demo on a fixed document outside the task seeds: find a field, then answer it."""
        doc = make_document(2**32 + 7, self.max_items)  # above every task seed range
        number = dict(doc.fields)["Number"]
        find = "<find>Number</find>" if self.call_format == "tagged" else \
            '<tool_call>{"name": "find", "arguments": {"text": "Number"}}</tool_call>'
        answer = f"<answer>{number}</answer>" if self.call_format == "tagged" else \
            '<tool_call>{"name": "answer", "arguments": {"answer": "' + number + '"}}</tool_call>'
        pairs = [(f"Document: 1 page. Question: What is the number on this {doc.kind}?",
                  f"Thought: I will find the number field.\n{find}"),
                 (f"Observation: page 1 line 2: Number: {number}", f"Thought: found it.\n{answer}")]
        return pairs[:count]


def parse_amount(text: str) -> float | None:
    """The last money amount in a line of OCR text (a helper for oracle policies and analyses)."""
    found = re.findall(r"\d[\d,]*\.\d{2}", text)
    return float(found[-1].replace(",", "")) if found else None
