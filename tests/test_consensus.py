"""Answer-consensus stopping (ESC, Adaptive-Consistency, Parallel-Probe) against stopping
points computed by hand on tests/data/answers_bank.json.

Prompt 0's final answers in stored order: 42 42 13 42 13 42 9 42 (tokens 35 45 30 60 50 25 70
40); prompt 1's: 1/2 1/2 1/2 1/2 3 1/2 (tokens 12 8 15 22 11 20)."""
from fractions import Fraction

import numpy as np
import pytest

from stopexp.answers_bank import load_answers_bank
from stopexp.search.adaptive_consistency import adaptive_consistency, beta_majority_prob
from stopexp.search.esc import esc
from stopexp.search.parallel_probe import parallel_probe

from conftest import ROOT


@pytest.fixture(scope="module")
def prompts():
    return load_answers_bank(ROOT / "tests" / "data" / "answers_bank.json").prompts


def test_esc_stops_after_the_first_unanimous_window(prompts):
    p0, p1, _ = prompts
    d = esc(p0, np.arange(8), window=2)  # window 1 = (42, 42): unanimous
    assert (d.launched, d.answer, int(d.spent.sum())) == (2, 1, 80)
    d = esc(p0, np.arange(8), window=4)  # (42 42 13 42), (13 42 9 42): never
    assert (d.launched, d.answer, int(d.spent.sum())) == (8, 1, 355)
    d = esc(p1, np.arange(6), window=4)  # 0.5, \frac{1}{2}, 1/2, .5 are one answer
    assert (d.launched, d.answer, int(d.spent.sum())) == (4, 1, 57)
    d = esc(p0, np.array([2, 4, 0, 1]), window=2)  # (13, 13) stops with the wrong answer
    assert (d.launched, d.answer) == (2, 3) and not p0.correct[d.answer]
    d = esc(prompts[2], np.array([5, 5, 0]), window=2)  # no answer is never unanimous
    assert d.launched == 3
    with pytest.raises(ValueError, match="esc window must be >= 1, got 0"):
        esc(p0, np.arange(8), window=0)


def test_beta_majority_probability_by_hand():
    # P(x > 1/2), x ~ Beta(a+1, b+1) = P(Bin(a+b+1, 1/2) <= a)
    assert beta_majority_prob(1, 0) == 0.75
    assert beta_majority_prob(3, 0) == 15 / 16
    assert beta_majority_prob(4, 0) == 31 / 32
    assert beta_majority_prob(2, 1) == 11 / 16
    assert beta_majority_prob(4, 2) == Fraction(99, 128)
    assert beta_majority_prob(6, 1) == 1 - Fraction(9, 256)
    assert beta_majority_prob(5, 1) == 1 - Fraction(8, 128)


def test_adaptive_consistency_stops_where_the_posterior_passes(prompts):
    p0, p1, _ = prompts
    d = adaptive_consistency(p1, np.arange(6))  # four alike: 31/32 >= 0.95 at the 4th
    assert (d.launched, d.answer, int(d.spent.sum())) == (4, 1, 57)
    # prompt 0 peaks at 0.875 (2 alike) and ends at 219/256 (5 vs 2): never 0.95
    d = adaptive_consistency(p0, np.arange(8))
    assert (d.launched, d.answer) == (8, 1)
    d = adaptive_consistency(p0, np.arange(8), threshold=0.85)  # 2 alike: 7/8
    assert (d.launched, int(d.spent.sum())) == (2, 80)
    d = adaptive_consistency(p0, np.arange(8), threshold=0.8)  # 1 sample: 0.75 < 0.8
    assert d.launched == 2
    d = adaptive_consistency(prompts[2], np.array([5, 0, 1, 3]), threshold=0.85)  # none, 4, 4, 4
    assert d.launched == 3  # the branch without an answer counts for no one: 4 4 -> 7/8 at 3
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\], got 1.5"):
        adaptive_consistency(p0, np.arange(8), threshold=1.5)


def test_parallel_probe_by_hand(prompts):
    p0 = prompts[0]
    d = parallel_probe(p0, np.arange(8), stable=3, deviate=2, warmup=1)
    # probe 1: leader 7 (a tie, seen first); 2: 42, branches 4 (13) and 6 (9) deviate once;
    # 3: 42 again, they deviate twice -> pruned at 30; 4: 42 a third time -> stop at 40
    assert d.answer == 1
    assert d.spent.tolist() == [35, 40, 30, 40, 30, 25, 30, 40]
    assert d.stopped(p0.tokens).tolist() == [False, True, False, True, True, False, True, False]
    # never stable: only the pruning acts, and the pruned branches leave the vote
    d = parallel_probe(p0, np.arange(8), stable=99, deviate=2, warmup=1)
    assert d.spent.tolist() == [35, 45, 30, 60, 30, 25, 30, 40] and d.answer == 1
    # stop on the first leader after the warm-up: 42 at 20 tokens; without a warm-up the
    # first probe's leader, 7 (a wrong answer), at 10 tokens
    d = parallel_probe(p0, np.arange(8), stable=1, deviate=2, warmup=1)
    assert d.answer == 1 and d.spent.tolist() == [20] * 8
    d = parallel_probe(p0, np.arange(8), stable=1, deviate=2, warmup=0)
    assert d.answer == 2 and d.spent.tolist() == [10] * 8
    with pytest.raises(ValueError, match="parallel_probe needs stable >= 1"):
        parallel_probe(p0, np.arange(8), stable=0)
