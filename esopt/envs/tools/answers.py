"""Answer checking: math answers compared as numbers or simple expressions (sympy), document answers by ANLS
and exact match.

Model output is untrusted: nothing here evaluates it as Python, and nothing runs long on it. A math answer is
reduced to a small expression language (numbers, + - * / ^, parentheses, sqrt, pi) by a whitelist before sympy
parses it; it is parsed unevaluated first, and evaluated only if it is short, has no nested powers, and every
power has a base of at most 1e6 and an exponent of at most 64 (`9^9^9`, `2^(10^20)` and `1e99999` are not
numbers here).
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from rapidfuzz.distance import Levenshtein

MAX_EXPRESSION_CHARS = 80
NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_WORDS = {"sqrt", "pi"}
# trailing words that change the value: never dropped as units
_KEEP_WORDS = {"pi", "sqrt", "hundred", "thousand", "million", "billion", "trillion", "percent", "e", "i"}
MAX_BASE, MAX_EXPONENT, MAX_E_NOTATION = 1e6, 64, 300


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
    lead = re.match(rf"^\s*({NUMBER.pattern}(?:\s*/\s*\d+)?)\s*%?\s*([A-Za-z][A-Za-z\s]*)$", text)
    if lead and not set(lead.group(2).lower().split()) & _KEEP_WORDS:  # "288 apples" -> "288", not "3 pi" -> "3"
        text = lead.group(1)
    text = re.sub(r"\s+", "", text).lower()
    return re.sub(r"^([-+]?)\(([\d.]+)\)/\((\d+)\)$", r"\1\2/\3", text)  # -\frac{3}{4} -> -3/4


def to_number(text: str):
    """The value of a normalised answer as a sympy number or expression, or None if it is not one."""
    s = normalize_math(text)
    if not s or len(s) > MAX_EXPRESSION_CHARS or not re.fullmatch(r"[0-9a-z.+\-*/^()]+", s):
        return None
    if set(re.findall(r"[a-z]+", NUMBER.sub(" ", s))) - _WORDS:  # only sqrt and pi, besides numbers
        return None
    for literal in NUMBER.findall(s):
        exponent = literal.lower().partition("e")[2]
        if exponent and abs(int(exponent)) > MAX_E_NOTATION:
            return None
    try:
        if NUMBER.fullmatch(s):
            return _sympy().Rational(str(Fraction(s)))
        from sympy.parsing.sympy_parser import implicit_multiplication, parse_expr, standard_transformations

        sp = _sympy()
        names = {"sqrt": sp.sqrt, "pi": sp.pi}
        scope = {"__builtins__": {}, "Integer": sp.Integer, "Float": sp.Float, "Rational": sp.Rational,
                 "Symbol": sp.Symbol, "Mul": sp.Mul, "Pow": sp.Pow, "Add": sp.Add}
        rules = (*standard_transformations, implicit_multiplication)
        s = s.replace("^", "**")
        shape = parse_expr(s, local_dict=dict(names), global_dict=dict(scope), transformations=rules, evaluate=False)
        if not _small_powers(shape):
            return None
        value = parse_expr(s, local_dict=dict(names), global_dict=dict(scope), transformations=rules)
    except Exception:  # untrusted text: any parse failure means "not a number"
        return None
    return value if getattr(value, "is_number", False) else None


def _small_powers(expr) -> bool:
    """Whether every power in an unevaluated expression is cheap to evaluate: no power inside a power, a base of
    at most MAX_BASE and an exponent of at most MAX_EXPONENT (both evaluated only when power-free)."""
    from sympy import Integer, Pow

    def powers(e) -> list:  # x^-1 is how an unevaluated division is written: not a power here
        nodes = e.atoms(Pow) | ({e} if isinstance(e, Pow) else set())
        return [p for p in nodes if p.args[1] != Integer(-1)]

    for node in powers(expr):
        base, exponent = node.args
        if powers(base) or powers(exponent):
            return False
        try:
            if abs(complex(exponent.evalf(15))) > MAX_EXPONENT or abs(complex(base.evalf(15))) > MAX_BASE:
                return False
        except (TypeError, ValueError):
            return False
    return True


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
        nl = Levenshtein.distance(a, g) / max(len(a), len(g), 1)
        best = max(best, 1.0 - nl if nl < threshold else 0.0)
    return best


def exact_match(answer: str, golds: list[str] | str) -> bool:
    golds = [golds] if isinstance(golds, str) else list(golds)
    return any(normalize_text(answer) == normalize_text(g) for g in golds)
