"""A cheap, sound "no" for math-verify: two parsed answers whose values differ at a point.

`stopexp.metrics.answers.equivalent` asks math-verify's `verify` whether two answers are
equal. For most pairs of a prompt's distinct answers the answer is no (two different
numbers written in LaTeX, a number and an expression with symbols), but `verify` reaches it
only after sympy's `simplify` of their difference, about 0.1 s a pair: an answers-only bank
of LaTeX answers then replays for minutes. `differ` proves that no in microseconds, and only
where `verify` cannot say yes: every comparison `verify` makes of two plain expressions
(structural, string, numeric within 6 decimals, `simplify(a - b) == 0`) needs them equal at
every point, so two expressions whose values at one point differ by far more than its
rounding are not equal. The point sets each free symbol to its own rational (a non-real one
where the symbol is declared non-real, an integer where it is declared one), reads each
undefined function (`\\mathbb{E}[X]`) as one fixed function, and works integrals, sums and
products out exactly, once per answer. Anything else (relations, sets, tuples, matrices,
percentages, lone symbols, a value that does not evaluate) is left to `verify`.
"""
from __future__ import annotations

import cmath
import threading
import zlib
from functools import lru_cache
from itertools import product

TOLERANCE = 1e-4  # relative to 1 + |a| + |b|: far above verify's 6-decimal rounding
DOIT_SECONDS = 5  # math-verify's own limit on a comparison
UNDONE_NAMES = ("Integral", "Sum", "Product")  # worked out once per answer: `_done`
DIGITS = 30       # evalf precision of a value at the point, before it becomes a float


def differ(gold: tuple, pred: tuple) -> bool:
    """Whether math-verify's `verify(list(gold), list(pred))` is surely False: for every pair
    of the two parses' elements (sympy values and normalised LaTeX strings, as
    `math_verify.parse` returns them), two different strings, a string and a value (never
    compared), or two plain expressions with different values at the point."""
    return all(_apart(g, p) for g, p in product(_fingerprint(gold), _fingerprint(pred)))


def tame(value, check) -> bool:
    """`check(value)` (stopexp.metrics.exact_values.sympy_tame: whether sympy compares
    `value` quickly), once per value: a vote compares each answer with many others."""
    try:
        return _checked(value, check)
    except TypeError:  # an unhashable value (a mutable matrix): not cached
        return check(value)


@lru_cache(maxsize=65536)
def _checked(value, check) -> bool:
    return check(value)


def _fingerprint(parsed: tuple) -> tuple:
    try:
        return fingerprint(parsed)
    except TypeError:  # an unhashable element (a mutable matrix): not cached
        return fingerprint.__wrapped__(parsed)


def _apart(g: tuple, p: tuple) -> bool:
    if g[0] == "text" and p[0] == "text":
        return g[1] != p[1]
    if g[0] == "text" or p[0] == "text":
        return True  # verify compares a string only with a string
    if g[0] == "unknown" or p[0] == "unknown":
        return False
    a, b = g[1], p[1]
    return abs(a - b) > TOLERANCE * (1 + abs(a) + abs(b))


@lru_cache(maxsize=65536)
def fingerprint(parsed: tuple) -> tuple:
    """Per element of a parse: ("text", the string stripped), ("value", its complex value at
    the point: `_value_at_point`) or ("unknown",): computed once per answer, so that each
    of a vote's pairs costs a few float operations."""
    out = []
    for x in parsed:
        if isinstance(x, str):
            out.append(("text", x.strip()))
            continue
        value = _value_at_point(x)
        out.append(("unknown",) if value is None else ("value", value))
    return tuple(out)


def _value_at_point(expr) -> complex | None:
    """The value of a plain expression (numbers, pi, e, i, symbols, + * ^, functions) at the
    point, as a complex float: each free symbol set to its own rational (non-real where it is
    declared non-real), each undefined function f(x, ...) read as its own fixed function
    (`_generic`); both are one instance of what `simplify` proves for all. None for anything
    else (a percentage's UnevaluatedExpr, an integral, a sum, an integer symbol) or a value
    that is not a finite number."""
    import sympy
    from sympy.core.function import AppliedUndef
    from sympy.core.numbers import ImaginaryUnit

    plain = (sympy.Number, sympy.NumberSymbol, ImaginaryUnit, sympy.Symbol, sympy.Add,
             sympy.Mul, sympy.Pow, sympy.Function)
    if not isinstance(expr, sympy.Expr) or isinstance(expr, (sympy.Symbol, sympy.MatrixExpr)):
        return None  # verify compares a lone symbol by its name (\text{answer} = a*n*s*w*e*r)
    if expr.has(*(getattr(sympy, name) for name in UNDONE_NAMES)):
        expr = _done(expr)
        if expr is None:
            return None
    for node in sympy.preorder_traversal(expr):
        if not isinstance(node, plain) or (isinstance(node, AppliedUndef) and node.is_real is not None):
            return None  # an integral, a sum, a function declared real: no instance at hand
    point = {}
    for i, s in enumerate(sorted(expr.free_symbols, key=sympy.default_sort_key)):
        # in (1.5, 2.4): a product of many symbols (a word read as letters) stays far from 0
        value = sympy.Rational(20 + 7 * i, 13 + 3 * i)
        if s.is_real is False:
            value += sympy.I * sympy.Rational(5 + 2 * i, 11 + 4 * i)
        elif s.is_positive is False:
            return None  # simplify may use identities that hold only for such values
        elif s.is_integer:
            value = sympy.Integer(3 + 2 * i)
        point[s] = value
    try:
        at = expr.replace(lambda n: isinstance(n, AppliedUndef), _generic).xreplace(point)
        value = complex(sympy.N(at, DIGITS))
    except Exception:  # sympy raises many kinds on odd input, complex() past 1e308: no proof
        return None
    return value if cmath.isfinite(value) else None


def _done(expr):
    """`expr` with its integrals, sums and products worked out exactly (sympy's `doit`, under
    math-verify's time limit in the main thread), or None when some stay or it fails."""
    import sympy
    from math_verify.errors import TimeoutException
    from math_verify.utils import timeout

    seconds = DOIT_SECONDS if threading.current_thread() is threading.main_thread() else None
    try:
        done = timeout(timeout_seconds=seconds)(expr.doit)()
    except (Exception, TimeoutException):
        return None
    undone = [getattr(sympy, name) for name in UNDONE_NAMES]
    return None if not isinstance(done, sympy.Expr) or done.has(*undone) else done


def _generic(call):
    """An undefined function's call f(x, y, ...) as c_f / (3 + |x + 2y + ...|), c_f fixed by
    f's name: equal arguments give equal values, as for any function; never a pole nor an
    overflow."""
    import sympy

    c = sympy.Rational(zlib.crc32(call.func.__name__.encode()) % 89 + 1, 7)
    return c / (3 + sympy.Abs(sum((k + 1) * a for k, a in enumerate(call.args))))
