"""Answer checking: math answers compared as numbers or simple expressions (sympy), document answers by ANLS
and exact match.

Model output is untrusted: nothing here evaluates it as Python. A math answer is reduced to a small
expression language (numbers, + - * / ^, parentheses, sqrt, pi) by a whitelist before sympy parses it, with
length and exponent caps, so `9^9^9^9` or `__import__` never reach the parser.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

MAX_EXPRESSION_CHARS = 80
NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_WORDS = {"sqrt", "pi"}


def _unwrap_latex(text: str) -> str:
    boxed = re.search(r"\\boxed\{(.*)\}", text)
    if boxed:
        text = boxed.group(1)
    text = re.sub(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", text)
    text = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", text)
    for a, b in ((r"\left", ""), (r"\right", ""), (r"\cdot", "*"), (r"\times", "*"), (r"\pi", "pi"), (r"\,", ""),
                 (r"\!", ""), ("$", ""), ("{", "("), ("}", ")")):
        text = text.replace(a, b)
    return text


def normalize_math(text: str) -> str:
    """A canonical string form: LaTeX unwrapped, thousands separators, a leading 'x =' and trailing words
    and punctuation dropped."""
    text = unicodedata.normalize("NFKC", str(text)).strip()
    text = _unwrap_latex(text).replace("−", "-").replace("×", "*").replace("÷", "/")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,234 -> 1234
    text = re.sub(r"^\s*(?:the answer is|answer:?|[a-z]\s*=)\s*", "", text, flags=re.I)
    text = text.strip().rstrip(".!;:")
    lead = re.match(rf"^\s*({NUMBER.pattern}(?:\s*/\s*\d+)?)\s*%?\s*[A-Za-z][A-Za-z\s]*$", text)
    if lead:  # "288 apples" -> "288"
        text = lead.group(1)
    text = re.sub(r"\s+", "", text).lower()
    return re.sub(r"^\(([-+]?[\d.]+)\)/\((\d+)\)$", r"\1/\2", text)  # \frac{3}{4} -> 3/4


def to_number(text: str):
    """The value of a normalised answer as a sympy number or expression, or None if it is not one."""
    s = normalize_math(text)
    if not s or len(s) > MAX_EXPRESSION_CHARS or not re.fullmatch(r"[0-9a-z.+\-*/^()]+", s):
        return None
    if set(re.findall(r"[a-z]+", NUMBER.sub(" ", s))) - _WORDS:  # only sqrt and pi, besides numbers
        return None
    s = s.replace("^", "**")
    for exponent in re.findall(r"\*\*\(?([-+]?[\d.]+)", s):
        try:
            if abs(float(exponent)) > 64:
                return None
        except ValueError:
            return None
    if s.count("**") > 2:
        return None
    try:
        if NUMBER.fullmatch(s):
            return _sympy().Rational(str(Fraction(s)))
        from sympy.parsing.sympy_parser import parse_expr

        sp = _sympy()
        value = parse_expr(s, local_dict={"sqrt": sp.sqrt, "pi": sp.pi},
                           global_dict={"__builtins__": {}, "Integer": sp.Integer, "Float": sp.Float,
                                        "Rational": sp.Rational, "Symbol": sp.Symbol}, evaluate=True)
    except Exception:  # untrusted text: any parse failure means "not a number"
        return None
    return value if getattr(value, "is_number", False) else None


def is_literal(normalized: str) -> bool:
    """A plain number or fraction (after `normalize_math`): 12, -0.5, 3/4, 1e3."""
    return bool(re.fullmatch(rf"{NUMBER.pattern}(?:/\d+)?", normalized))


def _sympy():
    import sympy

    return sympy


def math_equal(answer: str, gold: str, rel_tol: float = 1e-6) -> bool:
    """Whether `answer` states `gold`: equal normalised strings, or equal values (exact for rationals, within
    `rel_tol` relative otherwise, so 0.333333 matches 1/3 only if given to 6 digits). A gold number or
    fraction must be answered by a number or fraction (3/4 and 0.75 match; the unevaluated "1 + 2" does not
    answer 3), while a gold expression (2*sqrt(2)) accepts any equal expression (sqrt(8))."""
    if not isinstance(answer, str) or not answer.strip():
        return False
    a, g = normalize_math(answer), normalize_math(gold)
    if a == g:
        return True
    if is_literal(g) and not is_literal(a):  # "8-4" does not answer "what is 8 - 4?": numbers want numbers
        return False
    x, y = to_number(answer), to_number(gold)
    if x is None or y is None:
        return False
    try:
        if x.is_rational and y.is_rational and x == y:
            return True
        fx, fy = complex(x.evalf(30)), complex(y.evalf(30))
    except Exception:
        return False
    return abs(fx - fy) <= rel_tol * max(abs(fy), 1e-12)


def normalize_text(text: str) -> str:
    """DocVQA-style normalisation: case, surrounding punctuation and inner whitespace."""
    text = unicodedata.normalize("NFKC", str(text)).lower().strip()
    text = re.sub(r"\s+", " ", text)
    return text.strip(" .,:;!?\"'")


def levenshtein(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def anls(answer: str, golds: list[str] | str, threshold: float = 0.5) -> float:
    """Average Normalised Levenshtein Similarity for one question (DocVQA): the best over the gold answers of
    1 - NL(answer, gold), where NL >= threshold scores 0."""
    golds = [golds] if isinstance(golds, str) else list(golds)
    a = normalize_text(answer)[:1000]
    best = 0.0
    for gold in golds:
        g = normalize_text(gold)
        if not a and not g:
            return 1.0
        nl = levenshtein(a, g) / max(len(a), len(g), 1)
        best = max(best, 1.0 - nl if nl < threshold else 0.0)
    return best


def exact_match(answer: str, golds: list[str] | str) -> bool:
    golds = [golds] if isinstance(golds, str) else list(golds)
    return any(normalize_text(answer) == normalize_text(g) for g in golds)
