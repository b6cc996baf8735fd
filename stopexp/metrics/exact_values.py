"""Exact values of answers through math-verify (HuggingFace's Math-Verify, sympy-based):
a LaTeX answer's parse, the exact rational of a sympy expression or of a plain arithmetic
line, and whether sympy compares a value quickly. stopexp.metrics.answers reads answers
with these."""
from __future__ import annotations

import re
import threading
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

MAX_ANSWER_CHARS = 300    # longer "answers" are compared as strings, never parsed by sympy
MAX_DIGITS = 10_000      # no exact value is read or built past this many digits
PARSE_TIMEOUT_S = 5       # math-verify's own limit (SIGALRM; only in the main thread)
_ARITHMETIC = re.compile(r"[\d\s.,+\-*/×÷()^]*\d[\d\s.,+\-*/×÷()^]*")


def as_string(value: Fraction) -> str:
    # str(Decimal(int)) has no int conversion limit and writes every digit
    p, q = str(Decimal(value.numerator)), str(Decimal(value.denominator))
    return p if q == "1" else f"{p}/{q}"


def parse_timeout() -> int | None:
    # math-verify's timeout uses signal.alarm, which only the main thread may set
    return PARSE_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def parse_latex(latex: str) -> tuple:
    """math-verify's parse of one answer: (sympy value or string, normalised LaTeX), or ()."""
    from math_verify import parse

    return tuple(parse(f"$\\boxed{{{latex}}}$", parsing_timeout=parse_timeout()))


def exact_rational(expr) -> Fraction | None:
    """The exact rational value of a sympy expression built from numbers with + * / and
    small integer powers; None for anything else (symbols, roots, pi, huge powers)."""
    import sympy

    if isinstance(expr, sympy.Rational):
        return Fraction(int(expr.p), int(expr.q))
    if isinstance(expr, sympy.Float):
        return Fraction(str(expr)) if expr.is_finite else None
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        parts = [exact_rational(a) for a in expr.args]
        if any(p is None for p in parts):
            return None
        out = Fraction(0) if isinstance(expr, sympy.Add) else Fraction(1)
        for p in parts:
            out = out + p if isinstance(expr, sympy.Add) else out * p
        return out
    if isinstance(expr, sympy.Pow):
        base, exp = exact_rational(expr.base), exact_rational(expr.exp)
        if base is None or exp is None or exp.denominator != 1 or (base == 0 and exp < 0):
            return None
        size = max(abs(base.numerator), base.denominator).bit_length() * abs(exp.numerator)
        return base ** int(exp) if size <= MAX_DIGITS * 3.33 else None
    return None


def is_arithmetic(segment: str) -> bool:
    """Only numbers, operators and brackets, with at least one binary operator."""
    return bool(_ARITHMETIC.fullmatch(segment) and re.search(r"\d\s*[+\-*/×÷^]{1,2}\s*[\d(]", segment))


def arithmetic(segment: str) -> Fraction | None:
    """The exact value of a plain arithmetic line such as ``3 * 4`` or ``(10 - 4) / 3``;
    None when it is too long or its value too large to be an answer."""
    if len(segment) > MAX_ANSWER_CHARS:
        return None
    from math_verify import ExprExtractionConfig, parse

    s = segment.replace("×", "*").replace("÷", "/").replace(",", "")
    parsed = parse(s, [ExprExtractionConfig()], parsing_timeout=parse_timeout())
    return exact_rational(parsed[0]) if parsed and not isinstance(parsed[0], str) else None


def latex_value(answer: str) -> Fraction | None:
    parsed = parse_latex(answer.replace("$", ""))
    return exact_rational(parsed[0]) if parsed and not isinstance(parsed[0], str) else None


def latex_canonical(answer: str) -> str:
    import sympy

    parsed = parse_latex(re.sub(r"(?<!\\)\$", "", answer))
    if not parsed:
        return ""
    value, latex = parsed[0], parsed[-1]
    if isinstance(value, sympy.Eq) and isinstance(value.lhs, sympy.Symbol):
        value, latex = value.rhs, latex.split("=")[-1]  # x = 3 answers 3
    exact = None if isinstance(value, str) else exact_rational(value)
    return as_string(exact) if exact is not None else re.sub(r"\s+", "", latex)


def sympy_tame(value) -> bool:
    """Whether sympy can compare `value` quickly: no huge powers or factorials (a model
    that boxes 10^{10^{10}} would otherwise cost seconds, or hang outside the main thread)."""
    import sympy

    if isinstance(value, str) or not isinstance(value, sympy.Basic):
        return True
    for node in sympy.preorder_traversal(value):
        big = None
        if isinstance(node, sympy.Pow):
            big = node.exp
        elif isinstance(node, sympy.factorial):
            big = node.args[0]
        if big is not None and not big.free_symbols:
            exact = exact_rational(big)
            if exact is None or abs(exact) > 1000:
                return False
    return True
