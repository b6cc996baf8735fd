"""Reading final answers out of completions, the way graders of the field read them.

Two answer formats and two extraction modes:

- ``numeric`` (GSM8K): **strict** reads the first answer mark of any kind: a line marked
  ``#### 42`` (GSM8K's own grader and lm-evaluation-harness' strict-match take the first
  mark, so text a model invents after its answer is ignored) or ``The answer is 42`` (the
  chain-of-thought variant), or a ``\\boxed{}``; a mark whose answer `canonical` cannot
  read is none and the next mark counts (``#### Step 1``, a markdown heading).
- ``boxed`` (MATH): **strict** reads the last ``\\boxed{...}`` (braces balanced) that holds
  an answer (an empty box is none).
- **flexible** (either format): the strict answer when there is one, else the last number
  written anywhere in the completion (lm-evaluation-harness' flexible-extract takes the
  last number even when a mark exists; preferring the mark means flexible never rejects an
  answer that strict accepts).

Answers are compared in a canonical string form: a rational number is ``p`` or ``p/q``
(``0.5``, ``1/2``, ``\\frac{1}{2}``, ``\\$0.50``... are ``1/2``); any other LaTeX is
math-verify's normalised LaTeX without spaces. `equivalent` also accepts different
canonical strings that math-verify (HuggingFace's Math-Verify, sympy-based) proves equal,
e.g. ``\\sqrt{2}/2`` and ``\\frac{1}{\\sqrt{2}}``; `vote_clusters` groups a vote's answers
by it, so that equivalent answers vote together.

A numeric answer line states the value of the math it starts with, or nothing, never one
of its operands: the math runs up to the first word or sentence punctuation (``#### 72
apples`` and ``#### 5, so...`` are 72 and 5; ``#### 1,000, so`` and ``1,000.`` are 1000;
``$2^{10}$``, ``$3 \\times 4$`` and ``$1\\frac{1}{2}$`` are 1024, 12 and 3/2, evaluated by
math-verify; ``#### 3 * 4`` is 12; ``3 4`` states no number). ``1,000`` and ``1{,}000`` are
1000, and so are ``1 000``, ``1\\,000``, ``1\\ 000``, ``1~000`` (groups of three split by a space,
which math-verify reads as a product); Unicode minus signs are minus signs; with ``=`` the value after the last ``=`` counts
(``#### 3 * 4 = 12`` is 12); ``2 1/2`` is the mixed number 5/2; a number followed by a
space and a bracket is the answer and the bracket an aside (``18 (9 * 2)`` is 18); percent
signs, ``$`` and units after the number are dropped, and so are brackets around the whole
math, math delimiters and code marks (``(5)``, ``[5]``, ``$(12)$``, ``\\(5\\)``, `` `5` ``).
Numbers up to MAX_DIGITS digits are read exactly (a 5000-digit answer is a number); longer
ones, and values that would be longer, are none.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

from stopexp.core.config_text import has_answer
from stopexp.metrics.disproof import differ, tame
from stopexp.metrics.exact_values import (MAX_ANSWER_CHARS, MAX_DIGITS, arithmetic, as_string,
                                          is_arithmetic, latex_canonical, latex_value,
                                          parse_latex, parse_timeout, sympy_tame)

FORMATS = ("numeric", "boxed")
MODES = ("strict", "flexible")

# hyphen-like characters that models and PDFs write for a minus sign
_MINUS = str.maketrans({c: "-" for c in "\u2212\u2012\u2013\ufe63\uff0d"})
_VULGAR = re.compile("[\u00bc-\u00be\u2150-\u215e]")  # ¼ ½ ¾ ⅐ ... ⅞
_MARKS = (re.compile(r"####"), re.compile(r"(?i)\bthe (?:final )?answer is\b:?"))
_BOX = re.compile(r"\\(?:boxed|fbox)")
_INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)"  # "1,000, so" is 1000
_DEC = rf"(?:{_INT}(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
# a mixed number (2 1/2), a fraction (3/4) or a decimal, not glued to a word or a decimal point
_NUMBER = re.compile(rf"(?<![\w.])(?P<sign>-)?(?:(?:(?P<whole>\d+) )?(?P<num>{_DEC})/(?P<den>{_DEC})"
                     rf"|(?P<dec>{_DEC}))(?![\d/])")
# one token of the math an answer line starts with: a number, an operator, a bracket, a LaTeX
# command other than text and spacing (\text{ cm} and \quad start the words after it)
_MATH_TOKEN = re.compile(rf"\s+|{_DEC}|[-+*/×÷^()\[\]{{}}]|\\(?!text|mbox|mathrm|q?quad)[a-zA-Z]+")
_LATEX_SPACE = re.compile(r"\\[!,;: ]|~")
# -$5 is -5; \(5\), \[5\] and `5` are 5 (math and code delimiters)
_LATEX_DROP = re.compile(r"\\left|\\right|\\%|%|\^\{?\\circ\}?|\\\$|\$|\\[()\[\]]|`")
# \text{(2, 1)}: text markup around something that is not words
_TEXT_WITHOUT_WORDS = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}a-zA-Z]*)\}")
# thin spaces, LaTeX spaces and {,} between digit groups: 1\u2009000, 1\\,000, 1{,}000
_SPACE_IN_NUMBER = re.compile(r"(?<=\d)(?:[\u00a0\u2009\u202f]|\\[,!]|\{,\})(?=\d{3}(?!\d))")
# digit groups split by spaces (1 000, 12~500, 1\ 000: math-verify's product, 0): only groups
# of three after one to three digits, so 3 4, 2 1/2 and 2 \cdot 3 stay
_GROUP_SEP = r"(?:[ \u00a0\u2009\u202f]|\\[,!;: ]|\\thinspace ?|~|\{,\})"
_GROUPED = re.compile(rf"(?<![\d.,])\d{{1,3}}(?:{_GROUP_SEP}\d{{3}})+(?![\d/]|{_GROUP_SEP}\d)")


def _box_content(text: str, i: int) -> str | None:
    """The content of the box whose command ends at `i` (None when never closed)."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{":  # \boxed 5
        word = text[i:].split("$")[0].split()
        return word[0] if word else None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # never closed: malformed


def _unicode_numbers(text: str) -> str:
    """Vulgar fractions and superscripts written out before NFKC, which would turn ``2½``
    into ``21⁄2`` and ``10²`` into ``102``: ``2 1/2``, ``10^2``."""
    text = re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹]+", lambda m: "^" + unicodedata.normalize("NFKC", m.group()), text)
    return _VULGAR.sub(lambda m: f" {Fraction(unicodedata.numeric(m.group())).limit_denominator(16)}", text)


def _clean(text: str) -> str:
    """Unicode and LaTeX decoration that never changes a number's value removed:
    full-width digits, minus signs, vulgar fractions, superscripts, thin spaces between
    digit groups, ``{,}``, ``$``, ``\\$``, ``\\%``, ``^\\circ``, LaTeX spacing."""
    s = _SPACE_IN_NUMBER.sub("", _unicode_numbers(text))
    s = unicodedata.normalize("NFKC", s).translate(_MINUS).replace("{,}", ",")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    return _LATEX_DROP.sub("", _LATEX_SPACE.sub(" ", s))


def _value(m: re.Match) -> Fraction | None:
    """The exact value of a `_NUMBER` match, None when absurd (a zero denominator, an
    exponent or length past any real answer)."""
    g = m.groupdict()
    parts = [g["dec"]] if g["dec"] else [g["whole"] or "0", g["num"], g["den"]]
    if any(_too_long(p) for p in parts):
        return None
    # through Decimal: Fraction(str) stops at Python's 4300-digit int conversion limit
    parts = [Fraction(Decimal(p.replace(",", ""))) for p in parts]
    if g["dec"]:
        value = parts[0]
    elif parts[2] == 0:
        return None
    else:
        value = parts[0] + parts[1] / parts[2]
    return -value if g["sign"] else value


def _too_long(number: str) -> bool:
    """Whether a written number has more than MAX_DIGITS digits or an exponent past them."""
    mantissa, _, exponent = number.lower().partition("e")
    return len(mantissa) > MAX_DIGITS or len(exponent) > 6 or abs(int(exponent or 0)) > MAX_DIGITS


def last_number(text: str) -> str | None:
    """The last number written in `text` (e.g. ``1,000`` or ``2 1/2``; Unicode digits and
    minus signs normalised), else None."""
    found = [m for m in _NUMBER.finditer(_clean(text)) if _value(m) is not None]
    return found[-1].group(0) if found else None


def extract_answer(text: str, fmt: str, mode: str = "strict") -> str | None:
    """The final answer written in a completion, as written; None when there is none.

    fmt: ``numeric`` | ``boxed``; mode: ``strict`` | ``flexible`` (see the module doc). A
    mark whose answer `canonical` cannot read (``#### Step 1``, an empty box) is no answer:
    the next mark counts, then (flexible) the last number. Raises ValueError for an unknown
    fmt or mode."""
    if fmt not in FORMATS or mode not in MODES:
        raise ValueError(f"answer format {fmt!r} / extraction {mode!r} unknown; allowed: "
                         f"{', '.join(FORMATS)} / {', '.join(MODES)}")
    marked = _marked_answers(text) if fmt == "numeric" else reversed(_boxed_answers(text))
    answer = next((a for a in marked if a is not None and canonical(a, fmt)), None)
    if answer is None and mode == "flexible":
        answer = last_number(text)
    return answer


def _marked_answers(text: str) -> list[str | None]:
    """The answer of every mark in `text`, of any kind, in order: the rest of a ``####`` or
    ``The answer is`` line, or a box's content (None: a box never closed)."""
    marks = sorted([(m.start(), m.end(), True) for mark in _MARKS for m in mark.finditer(text)]
                   + [(m.start(), m.end(), False) for m in _BOX.finditer(text)])
    return [text[end:].split("\n", 1)[0].strip() if line else _box_content(text, end)
            for _, end, line in marks]


def _boxed_answers(text: str) -> list[str | None]:
    """The content of every ``\\boxed{...}`` or ``\\fbox{...}`` in `text`, in order."""
    return [_box_content(text, m.end()) for m in _BOX.finditer(text)]


def _numeric_value(answer: str) -> Fraction | None:
    """The number an answer line states (see the module doc), else None."""
    s = _clean(answer)
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    s = re.sub(r"(?<=\d) ?[x×] ?(?=\d)", " * ", s.strip().lstrip("*_"))  # "3 x 4": x for times
    math = _unbracketed(_leading_math(s)).lstrip("+ ")  # +7 is 7
    m = _NUMBER.fullmatch(math)
    if m:
        return _value(m)
    if len(math) > MAX_ANSWER_CHARS:
        return None
    if "\\" in math or "{" in math:  # LaTeX: 2^{10}, 3 \times 4, 1\frac{1}{2}
        return latex_value(math)
    return arithmetic(math) if is_arithmetic(math) else None  # "3 4" is no one number


def _unbracketed(math: str) -> str:
    """`math` without the brackets around all of it: ``(5)``, ``[5]``, ``((5))`` state 5
    (``(2) + (3)`` keeps its brackets)."""
    while len(math) > 1 and math[0] + math[-1] in ("()", "[]", "{}"):
        depth = 0
        for i, c in enumerate(math):
            depth += (c in "([{") - (c in ")]}")
            if depth == 0 and i < len(math) - 1:
                return math  # the first bracket closes before the end
        math = math[1:-1].strip()
    return math


def _leading_math(s: str) -> str:
    """The math `s` starts with (numbers, operators, brackets, LaTeX commands), up to the
    first word or punctuation, without trailing operators, brackets or markdown."""
    i = 0
    while m := _MATH_TOKEN.match(s, i):
        if i > MAX_ANSWER_CHARS and not m.group().isspace():
            return s  # too long to be math (a long number alone is one token): no answer
        if m.group() in "([" and s[i - 1:i].isspace() and _NUMBER.fullmatch(s[:i].strip()):
            break  # a number, a space and a bracket: the bracket is an aside
        i = m.end()
    return re.sub(r"[\s(\[{+\-*/×÷^_]+$", "", s[:i])


@lru_cache(maxsize=65536)
def canonical(answer: str | None, fmt: str) -> str:
    """One string per equivalent answer; "" when there is none.

    numeric: the stated number as ``p`` or ``p/q`` ("" without a number). boxed: a rational
    value as ``p`` or ``p/q``; an equation ``x = v`` as v; anything else math-verify's
    normalised LaTeX without spaces (or the answer without spaces when it cannot parse)."""
    if not answer or not answer.strip():
        return ""
    answer = _GROUPED.sub(lambda m: re.sub(_GROUP_SEP, "", m.group()), answer)
    if fmt == "numeric":
        value = _numeric_value(answer)
        return as_string(value) if value is not None else ""
    plain = re.sub(r"\s+", "", answer)
    answer = _TEXT_WITHOUT_WORDS.sub(r"\1", answer)
    m = _NUMBER.fullmatch(_clean(answer).strip().rstrip("."))
    if m and _value(m) is not None:  # a number of any length up to MAX_DIGITS digits
        return as_string(_value(m))
    return plain if len(answer) > MAX_ANSWER_CHARS else latex_canonical(answer) or plain


@lru_cache(maxsize=65536)
def equivalent(answer: str, reference: str, fmt: str = "boxed") -> bool:
    """Whether a canonical answer equals a canonical reference: the same string, or (boxed
    format) math-verify proves them equal. No answer is never equivalent."""
    if not answer or not reference:
        return False
    if answer == reference:
        return True
    rational = re.compile(r"-?\d+(?:/\d+)?")
    if fmt == "numeric" or (rational.fullmatch(answer) and rational.fullmatch(reference)):
        return False  # two different exact numbers
    if max(len(answer), len(reference)) > MAX_ANSWER_CHARS:
        return False
    from math_verify import verify

    gold, pred = parse_latex(reference), parse_latex(answer)
    if not (gold and pred) or not all(tame(x, sympy_tame) for x in (*gold, *pred)):
        return False
    if differ(gold, pred):  # values apart at a point: no simplify needed (stopexp.metrics.disproof)
        return False
    return verify(list(gold), list(pred), timeout_seconds=parse_timeout())


def answer_of(text: str, fmt: str, mode: str = "strict") -> str:
    """The canonical answer of a completion ("" when it has none)."""
    return canonical(extract_answer(text, fmt, mode), fmt)


def vote_clusters(answers, fmt: str | None) -> list:
    """`answers` (canonical; "" or None for none, which stay as they are) with each answer
    replaced by its cluster's representative, so that a vote by string equality counts
    equivalent answers as one (DeepConf issue 15: ``\\frac{\\sqrt{2}}{2}``, ``\\sqrt{2}/2``
    and ``\\frac{1}{\\sqrt{2}}`` are one answer).

    Only the boxed format has distinct equivalent strings (a numeric canonical answer is
    one string per value; fmt None: answers that are not math, e.g. data-to-text's, vote by
    string). The distinct answers, in order of first appearance, each join the first
    cluster whose first member `equivalent` accepts it against, else start one; a
    cluster's representative is its most frequent member, ties to the one seen first.
    Equivalence of a pair is cached (`equivalent`), so a prompt's votes cost one
    math-verify comparison per pair of distinct answers, once."""
    if fmt != "boxed":
        return list(answers)
    counts = Counter(a for a in answers if a)  # insertion order: first appearance
    clusters: list[list[str]] = []
    for a in counts:
        home = next((c for c in clusters if equivalent(a, c[0], fmt)), None)
        if home is None:
            clusters.append([a])
        else:
            home.append(a)
    representative = {a: max(c, key=counts.__getitem__) for c in clusters for a in c}
    return [representative[a] if a else a for a in answers]


def vote(answers: list, fmt: str | None = None) -> object:
    """Majority vote over answers (None, "" and blank ones never vote); ties go to the first.
    Equivalent answers of the answer format `fmt` vote as one, and the winner is their
    cluster's representative (stopexp.metrics.answers.vote_clusters; None: by string)."""
    counts: dict = {}
    for a in vote_clusters(answers, fmt):
        if has_answer(a):
            counts[a] = counts.get(a, 0) + 1
    return max(counts, key=counts.get) if counts else None
