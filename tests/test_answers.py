"""Answer extraction and canonical forms (stopexp/metrics/answers.py), pinned value by value."""
import json
import threading
import time

import pytest

from conftest import ROOT
from stopexp.metrics.answers import (MAX_DIGITS, answer_of, canonical, equivalent, extract_answer,
                                   vote_clusters)

# (completion, canonical answer under strict numeric extraction)
NUMERIC = [
    ("#### 72", "72"),
    ("#### 72,", "72"),                          # a trailing comma ends the number
    ("#### 5, so she has five", "5"),
    ("#### 5.", "5"),                            # ... and so does a full stop
    ("#### 0.5.", "1/2"),
    ("#### −3", "-3"),                           # U+2212 minus keeps its sign
    ("#### –3", "-3"),                           # an en dash written as a minus
    ("#### 3 * 4 = 12", "12"),                   # the value after the last "="
    ("#### 3 * 4", "12"),                        # a plain arithmetic line, evaluated exactly
    ("#### 3 x 4", "12"),
    ("#### (10 - 4) / 4", "3/2"),
    ("#### 2 1/2", "5/2"),                       # a mixed number, not 21/2
    ("#### -2 1/2", "-5/2"),
    ("#### 1/2", "1/2"),
    ("#### $1,000.", "1000"),
    ("#### 1,000.50", "2001/2"),
    ("#### 1,234,567", "1234567"),
    ("#### 1\u2009000", "1000"),                 # a thin space between digit groups
    ("#### １２", "12"),                          # full-width digits
    ("#### 2½", "5/2"),                          # a vulgar fraction, not 21/2
    ("#### ¾", "3/4"),
    ("#### 10²", "100"),                         # a superscript, not 102
    ("#### 50%", "50"),
    ("#### −$5", "-5"),                          # a sign before the currency
    ("#### **72**", "72"),                       # markdown emphasis
    ("#### 72 apples", "72"),
    ("#### $18.90", "189/10"),
    ("#### 12.00", "12"),
    ("#### -0", "0"),
    ("#### 1e3", "1000"),
    ("#### \\frac{3}{4}", "3/4"),
    ("#### x = 5", "5"),
    ("#### 4\nQuestion: Ben has 3 books...\n#### 9", "4"),   # the first mark counts
    ("#### five\n#### 5", "5"),                  # a mark without a number is skipped
    ("#### Step 1: add\n3 + 4 = 7\n#### 7", "7"),  # a markdown heading is no answer
    ("The answer is that 3 are left.", ""),
    ("She has 7 apples.\nThe answer is 7.", "7"),  # the chain-of-thought mark
    ("So the final answer is: 3 + 4 = 7", "7"),
    ("#### 9 and \\boxed{4}", "9"),              # the mark before any box
    ("no mark but \\boxed{7}", "7"),
    ("no mark but \\fbox{8}", "8"),
    ("#### 1/0", ""),                            # absurd values are no answer
    ("#### 1e999999", ""),
    ("#### 2^100000", ""),                       # too large to be an answer, never an operand
    ("#### 9**9**9", ""),
    ("####\n42", ""),                            # strict: the number must be on the mark's line
    ("She has 7 apples.", ""),
    # LaTeX: the value of the whole expression, never an operand
    ("The answer is $2^{10}$.", "1024"),
    ("The answer is $3 \\times 4$.", "12"),
    ("The answer is $1\\frac{1}{2}$.", "3/2"),
    ("#### $-1\\frac{1}{2}$", "-3/2"),
    ("#### $\\dfrac{3}{4}$ of the cake", "3/4"),
    ("#### 1.5 \\times 10^3", "1500"),
    ("#### 2 \\cdot 5 = 10", "10"),
    ("The answer is $\\boxed{12}$.", "12"),
    ("#### 5\\text{ cm}", "5"),
    ("#### 12 \\quad \\text{apples}", "12"),
    # thousands separators before text or punctuation
    ("#### 1,000, so she has a thousand", "1000"),
    ("#### 1,000 apples", "1000"),
    ("The answer is 1,000,000 apples.", "1000000"),
    ("#### 1,234.5, which is", "2469/2"),
    ("#### 3, 4 and 5", "3"),                    # a comma and a space end the number
    ("#### 18 (9 * 2)", "18"),                   # a bracket after a space is an aside
    ("#### 3 4", ""),                            # two numbers are not one
    ("#### +7", "7"),
    # strict: the first mark of any kind counts
    ("The answer is 4.\n#### 9", "4"),
    ("#### 9\nThe answer is 4.", "9"),
    ("so \\boxed{3}.\nQuestion: ...\n#### 9", "3"),
    ("The answer is five.\n\\boxed{\\text{five}}\n#### 5", "5"),  # marks without a number skipped
]

# (what a \boxed{} holds, its canonical form)
BOXED = [
    ("\\$18.90", "189/10"),                      # no stray backslash
    ("\\$1,000.00", "1000"),
    ("1{,}500", "1500"),                         # {,} as a thousands separator
    ("1\\,000", "1000"),
    ("\\frac{1}{2}", "1/2"),
    ("\\left( 3 \\right)", "3"),
    ("\\dfrac12", "1/2"),
    ("0.5", "1/2"),
    ("-\\frac{3}{4}", "-3/4"),
    ("−0.75", "-3/4"),
    ("2\\frac{1}{2}", "5/2"),
    ("\\frac{1}{3}+\\frac{1}{7}", "10/21"),
    ("2^{-1}", "1/2"),
    ("10^{3}", "1000"),
    ("180^\\circ", "180"),
    ("50\\%", "50"),
    ("5\\text{ cm}", "5"),
    ("3.0", "3"),
    ("$5$", "5"),
    ("x=3", "3"),                                # an assignment answers its value
    ("x + 1", "x+1"),
    ("(2, 1)", "(2,1)"),
    ("\\text{(2, 1)}", "(2,1)"),
    ("[1,2)", "[1,2)"),
    ("\\{1,2\\}", "\\{1,2\\}"),
    ("1,2", "1,2"),                              # two numbers, not one thousand and two
    ("\\sqrt{2}/2", "\\sqrt{2}/2"),
    ("\\frac{\\sqrt2}{2}", "\\frac{\\sqrt{2}}{2}"),
    ("\\pi", "\\pi"),
    ("9^{9^{9}}", "9^{9^{9}}"),                  # never evaluated
    ("\\text{Monday}", "\\text{Monday}"),
]


@pytest.mark.parametrize("text, expected", NUMERIC)
def test_numeric_answers_canonical(text, expected):
    assert answer_of(text, "numeric", "strict") == expected


@pytest.mark.parametrize("content, expected", BOXED)
def test_boxed_answers_canonical(content, expected):
    assert canonical(content, "boxed") == expected
    assert answer_of(f"so the answer is $\\boxed{{{content}}}$.", "boxed") == expected


@pytest.mark.parametrize("content, expected", [
    ("1 000", "1000"), ("12 500", "12500"), ("1\\,000", "1000"), ("1{,}000", "1000"),
    ("12~500", "12500"), ("1\\ 000", "1000"), ("1\u2009000", "1000"), ("1\u202f000", "1000"),
    ("1\\;000", "1000"), ("1\\thinspace 000", "1000"), ("1 234 567", "1234567"),
    ("12 500.5", "25001/2"), ("-12 500", "-12500"), ("x = 12 500", "12500"),
    ("\\frac{1 000}{8}", "125"), ("[1 000, 2 000]", "[1000,2000]"),
    # real products and mixed numbers are not digit groups
    ("2 \\cdot 3", "6"), ("2x", "2x"), ("2 1/2", "5/2"),
])
def test_digit_groups_split_by_spaces_are_one_number(content, expected):
    """math-verify reads 1 000 as a product (0) and 12 500 as 512."""
    assert canonical(content, "boxed") == expected
    assert answer_of(f"so $\\boxed{{{content}}}$.", "boxed") == expected
    if expected.lstrip("-").replace("/", "").isdigit() and "=" not in content and "," not in content:
        assert answer_of(f"#### {content}", "numeric") == expected


def test_spaces_that_are_no_digit_groups_stay():
    # a list of numbers in free text keeps its numbers (flexible: the last one)
    assert answer_of("the terms are 1 2 3 100 200", "numeric", "flexible") == "200"
    assert answer_of("#### 3 4", "numeric") == ""  # two numbers state none
    assert answer_of("#### 12 5000", "numeric") == ""  # 5000 is no group of three


def test_the_table_is_large():
    assert len(NUMERIC) + len(BOXED) >= 40


@pytest.mark.parametrize("answer, reference, same", [
    ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}", True),   # different strings, proved equal
    ("1+x", "x+1", True),
    ("\\{2,1\\}", "\\{1,2\\}", True),
    ("-3", "3", False),
    ("x-1", "x+1", False),
    ("1/2", "0.5", True),
    ("", "", False),           # no answer is never right
    ("10^{10^{10}}", "29", False),  # never evaluated: no seconds-long comparison
    ("100000!", "\\sqrt{2}", False),
    ("x^{2}", "x \\cdot x", True),
])
def test_equivalent(answer, reference, same):
    a, r = canonical(answer, "boxed") if answer else "", canonical(reference, "boxed") if reference else ""
    assert equivalent(a, r, "boxed") is same
    assert equivalent(answer, reference, "boxed") is same


# (answer, reference, whether `differ` proves them unequal without math-verify)
DISPROOFS = [
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{2}", True),  # two numbers apart
    ("x+1", "x-1", True),                 # apart at the point of x
    ("ERR", "42", True),                  # symbols E, R against a number
    ("\\pi", "3.14", True),
    ("3i", "3", True),                    # i: a symbol to math-verify's parser
    ("9\\%", "9", True),                  # parsed as a string only: never equal to a value
    ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}", False),  # equal: math-verify says so
    ("0.333333", "\\frac{1}{3}", False),  # within 6 decimals: math-verify's rounding decides
    ("\\{1,2\\}", "\\{1,3\\}", False),   # sets, relations and lone symbols: math-verify only
    ("x=3", "3", False),
    ("x", "y", False),
    ("\\int_0^1 x dx", "1", True),        # worked out once: 1/2
    ("\\int_0^1 x dx", "\\frac{1}{2}", False),
    ("\\mathbb{E}[X]+1", "\\mathbb{E}[X]", True),  # an undefined function: one instance of it
    ("\\mathbb{E}[X]+1", "1+\\mathbb{E}[X]", False),
]


@pytest.mark.parametrize("answer, reference, fast", DISPROOFS)
def test_a_disproof_is_never_a_pair_math_verify_accepts(answer, reference, fast):
    from math_verify import verify

    from stopexp.metrics.exact_values import parse_latex
    from stopexp.metrics.disproof import differ

    gold, pred = parse_latex(reference), parse_latex(answer)
    assert differ(gold, pred) is fast
    if fast:  # sound: math-verify finds them unequal too
        assert verify(list(gold), list(pred)) is False


def test_percentages_and_complex_values_are_left_to_math_verify():
    import sympy
    from math_verify import verify

    from stopexp.metrics.disproof import differ

    percent = sympy.Mul(9, sympy.UnevaluatedExpr(sympy.Rational(1, 100)), evaluate=False)
    assert verify(sympy.Integer(9), percent) and not differ((sympy.Integer(9),), (percent,))
    two_i = 2 * sympy.I  # a complex value: apart from 2 by the modulus of the difference
    assert differ((two_i,), (sympy.Integer(2),)) and not verify(two_i, sympy.Integer(2))
    assert not differ((two_i,), (sympy.I * 2,))


def test_equivalent_asks_math_verify_only_what_no_point_decides(monkeypatch):
    import math_verify

    asked = []
    real = math_verify.verify
    monkeypatch.setattr(math_verify, "verify", lambda g, p, **k: asked.append(1) or real(g, p, **k))
    equivalent.cache_clear()
    assert not equivalent("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{5}}{2}", "boxed") and not asked
    assert equivalent("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", "boxed") and len(asked) == 1


def test_long_numbers_are_numbers():
    # past Python's 4300-digit int <-> str conversion limit, up to MAX_DIGITS digits
    long = "7" * 5000
    assert answer_of(f"#### {long}", "numeric") == long
    assert answer_of(f"The answer is {long}.", "numeric") == long
    assert answer_of(f"she has {long} apples", "numeric", "flexible") == long
    assert answer_of(f"#### {long}.5", "numeric") == f"1{'5' * 5000}/2"  # (2 * 7...7 + 1) / 2
    assert canonical(long, "boxed") == long and equivalent(canonical(long + ".0", "boxed"), long)
    assert answer_of("#### 10^{5000}", "numeric") == "1" + "0" * 5000
    assert answer_of(f"#### {long} + 1", "numeric") == ""  # too long to evaluate, never an operand
    assert answer_of("#### " + "7" * (MAX_DIGITS + 1), "numeric") == ""
    assert answer_of(f"#### 1e{MAX_DIGITS + 1}", "numeric") == ""


def test_vote_clusters_group_equivalent_answers():
    # DeepConf issue 15: four ways to write sqrt(2)/2, all canonical strings of their own
    forms = ["\\frac{\\sqrt2}{2}", "\\frac{1}{\\sqrt2}", "\\sqrt2/2", "\\sqrt{0.5}"]
    half_root = [canonical(f, "boxed") for f in forms]
    assert len(set(half_root)) == 4
    answers = ["1", half_root[0], "", "1", half_root[1], half_root[2], None, half_root[3]]
    # the representative: the most frequent member, ties to the one seen first
    rep = half_root[0]
    assert vote_clusters(answers, "boxed") == ["1", rep, "", "1", rep, rep, None, rep]
    again = [half_root[1], half_root[0], half_root[1]]  # \frac{1}{\sqrt{2}} twice: it represents
    assert vote_clusters(again, "boxed") == [half_root[1]] * 3
    # numeric answers are one string per value, and answers that are not math (fmt None)
    # vote by string: math-verify would read "Alimentum|rated 5" as 5
    assert vote_clusters(["1/2", "1/2", "3"], "numeric") == ["1/2", "1/2", "3"]
    words = ["Alimentum|rated 5", "Bibimbap|rated 5"]
    assert equivalent(*words, "boxed") and vote_clusters(words, None) == words


def test_minus_sign_is_never_lost():
    assert not equivalent(answer_of("#### −3", "numeric"), canonical("3", "numeric"), "numeric")


@pytest.mark.parametrize("text, fmt, strict, flexible", [
    ("She has 4 + 3 = 7 apples.", "numeric", None, "7"),
    ("She has 7 apples.\n#### 7\nQuestion: 12 birds", "numeric", "7", "7"),  # the mark wins
    ("so 12 - 5 = 7", "boxed", None, "7"),
    ("we get $\\boxed{\\frac{1}{2}}$, not 3", "boxed", "\\frac{1}{2}", "\\frac{1}{2}"),
    ("It costs $1,000.", "numeric", None, "1,000"),
    ("It is 10-3", "numeric", None, "3"),          # a minus between numbers is subtraction
    ("no number here", "numeric", None, None),
])
def test_strict_and_flexible_extraction(text, fmt, strict, flexible):
    assert extract_answer(text, fmt, "strict") == strict
    assert extract_answer(text, fmt, "flexible") == flexible


# a mark whose answer canonical() cannot read never blocks the next mark or the last number;
# brackets around the whole math, math delimiters and code marks are dropped
@pytest.mark.parametrize("text, fmt, strict, flexible", [
    ("#### (5)", "numeric", "5", "5"),
    ("#### (5)\nThe answer is 5", "numeric", "5", "5"),
    ("#### Step 1: add\nThe answer is 12", "numeric", "12", "12"),
    ("The answer is $(12)$", "numeric", "12", "12"),
    ("#### [5]", "numeric", "5", "5"),
    ("#### {5}", "numeric", "5", "5"),
    ("#### ((5))", "numeric", "5", "5"),
    ("#### ( 5 )", "numeric", "5", "5"),
    ("#### ($5)", "numeric", "5", "5"),
    ("The answer is **(5)**.", "numeric", "5", "5"),
    ("The answer is: (−5).", "numeric", "-5", "-5"),
    ("#### (5) apples", "numeric", "5", "5"),
    ("#### (5/2)", "numeric", "5/2", "5/2"),
    ("#### (2 + 3) = (5)", "numeric", "5", "5"),
    ("The answer is \\(5\\).", "numeric", "5", "5"),
    ("The answer is \\[5\\]", "numeric", "5", "5"),
    ("#### `5`", "numeric", "5", "5"),
    ("#### **5**", "numeric", "5", "5"),
    ("#### 5.", "numeric", "5", "5"),
    ("\\boxed{(5)}", "numeric", "5", "5"),
    ("#### (2, 3)", "numeric", "", "3"),         # a pair states no one number
    ("\\boxed{(5)}", "boxed", "5", "5"),
    ("\\boxed{[5]}", "boxed", "5", "5"),
    ("So 3 + 4 = 7. \\boxed{}", "boxed", "", "7"),  # an empty box is no answer
    ("\\boxed{7}, checked: \\boxed{ }", "boxed", "7", "7"),
])
def test_an_unreadable_mark_leaves_the_next_one_to_count(text, fmt, strict, flexible):
    assert (answer_of(text, fmt, "strict"), answer_of(text, fmt, "flexible")) == (strict, flexible)


@pytest.mark.parametrize("text", ["\\boxed{(5)}", "\\boxed{[5]}", "The answer is $(12)$",
                                  "The answer is \\(5\\).", "#### ( 5 )", "$\\boxed{((7))}$"])
def test_bracketed_answers_read_as_math_verify_reads_them(text):
    from math_verify import parse

    assert answer_of(text, "numeric", "strict") == str(parse(text)[0])


def test_unknown_format_or_mode_is_refused():
    with pytest.raises(ValueError, match="extraction 'loose' unknown; allowed: .*strict, flexible"):
        extract_answer("#### 1", "numeric", "loose")


def test_works_outside_the_main_thread_and_is_cached():
    # math-verify's timeout needs signal.alarm, which only the main thread may set
    out = []
    t = threading.Thread(target=lambda: out.append((canonical("\\frac{7}{3}+1", "boxed"),
                                                    equivalent("\\sqrt{3}/3", "\\frac{1}{\\sqrt{3}}"))))
    t.start()
    t.join()
    assert out == [("10/3", True)]
    canonical("\\frac{\\sqrt{5}}{5}", "boxed")
    start = time.perf_counter()
    for _ in range(10000):  # the vote reads every path's answer: repeats are free
        canonical("\\frac{\\sqrt{5}}{5}", "boxed")
    assert time.perf_counter() - start < 0.1


SMOLLM2 = ROOT / "tests" / "data" / "smollm2_completions.jsonl"


def test_real_smollm2_completions_in_both_modes():
    """Completions of SmolLM2-135M-Instruct (plain-text few-shot GSM8K-style prompts,
    temperature 0.9), with the answers a reader finds in them under each mode."""
    rows = [json.loads(line) for line in SMOLLM2.read_text().splitlines()]
    assert len(rows) >= 20
    for r in rows:
        assert answer_of(r["completion"], "numeric", "strict") == r["strict"], r["completion"]
        assert answer_of(r["completion"], "numeric", "flexible") == r["flexible"], r["completion"]
    strict = sum(r["strict"] != "" for r in rows)
    flexible = sum(r["flexible"] != "" for r in rows)
    assert strict < flexible == len(rows)  # flexible reads an answer wherever strict does, and more
