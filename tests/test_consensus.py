"""Answer-consensus stopping (ESC, Adaptive-Consistency, Parallel-Probe) against stopping
points computed by hand on tests/data/answers_bank.json, and every vote of the project
counting equivalent answers as one (DeepConf issue 15).

Prompt 0's final answers in stored order: 42 42 13 42 13 42 9 42 (tokens 35 45 30 60 50 25 70
40); prompt 1's: 1/2 1/2 1/2 1/2 3 1/2 (tokens 12 8 15 22 11 20)."""
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import outcome
from stopexp.metrics import cons_at_n
from stopexp.stopping.adaptive_consistency import adaptive_consistency, beta_majority_prob
from stopexp.stopping.answers_bank import load_answers_bank, vote_codes
from stopexp.stopping.branch_draws import no_prune
from stopexp.stopping.esc import esc
from stopexp.stopping.parallel_probe import parallel_probe
from stopexp.stopping.replay import stopping_outcomes
from stopexp.store import bank_plan
from stopexp.metrics.answers import canonical, equivalent, vote


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
    p0 = prompts[0]  # leaders from probe 2 on: 42 at 20, 30, 40 ... tokens
    d = parallel_probe(p0, np.arange(8), stable=2, deviate=2, warmup=0)
    # probe 2: branches 2 (none), 4 (13) and 6 (9) deviate once; 3: twice -> pruned at 30
    # (branch 2 has then spent all its 30); 4: 42 a second time again -> stop at 40
    assert d.answer == 1
    assert d.spent.tolist() == [35, 40, 30, 40, 30, 25, 30, 40]
    assert d.stopped(p0.tokens).tolist() == [False, True, False, True, True, False, True, False]
    # a warm-up of one step: deviations count from probe 3, 4 and 6 are pruned at 40, branch 2
    # has ended; the leader repeats at probes 3, 4 and 5 -> stop at 50 (branch 3, 60 tokens)
    d = parallel_probe(p0, np.arange(8), stable=3, deviate=2, warmup=1)
    assert d.answer == 1 and d.spent.tolist() == [35, 45, 30, 50, 40, 25, 40, 40]
    # never stable: only the pruning acts, and the pruned branches leave the vote
    d = parallel_probe(p0, np.arange(8), stable=99, deviate=2, warmup=0)
    assert d.spent.tolist() == [35, 45, 30, 60, 30, 25, 30, 40] and d.answer == 1
    with pytest.raises(ValueError, match="parallel_probe needs stable >= 1"):
        parallel_probe(p0, np.arange(8), stable=0)


def test_parallel_probe_pruned_branches_vote_or_not(tmp_path):
    """Five branches probed every 10 tokens (60 tokens each); from probe 2 on: 1, 1, 2, 2, 1,
    then 5, 5, 2, 2, 2. deviate=1, no warm-up, stop on one repeat of the leader."""
    rows = [["1", "5"], ["1", "5"], ["2", "2"], ["2", "2"], ["1", "2"]]
    data = [{"question": "q", "gold_answer": "2", "probe_freq": 10,
             "each_branch": [[["", a, b, b, b], 60, b] for a, b in rows]}]
    (tmp_path / "bank.json").write_text(json.dumps(data))
    p = load_answers_bank(tmp_path / "bank.json").prompts[0]
    # active voters (the published Parallel-Probe): probe 2 leads 1, prunes 2 and 3 at 20;
    # probe 3 leads 5 (2 to 1), prunes 4 at 30; probe 4: 5 again -> stop, 5 (wrong)
    d = parallel_probe(p, np.arange(5), stable=1, deviate=1, warmup=0)
    assert p.answers[d.answer] == "5" and d.spent.tolist() == [40, 40, 20, 20, 30]
    # pruned branches keep their vote (ParallelESTPruning): probe 3 leads 2 (3 to 2), prunes
    # 0 and 1 at 30; probe 4: 2 again -> stop, 2 (right)
    d = parallel_probe(p, np.arange(5), stable=1, deviate=1, warmup=0, vote_pruned=True)
    assert p.answers[d.answer] == "2" and d.spent.tolist() == [30, 30, 20, 20, 40]


def test_parallel_probe_defaults_are_the_published_settings():
    import inspect

    # zhengkid/Parallel-Probe evaluation/evaluation_main_table.py: T=40, prune_patience=7,
    # warm_up=15 (the README's Parallel-Probe rows: majority over the branches not pruned)
    sig = inspect.signature(parallel_probe).parameters
    assert {k: sig[k].default for k in ("stable", "deviate", "warmup", "vote_pruned")} == \
        {"stable": 40, "deviate": 7, "warmup": 15, "vote_pruned": False}
    from conftest import compose

    stopping = compose("answers_replay", ["bank=b.json"]).stopping  # answers_replay's defaults
    assert dict(stopping.parallel_probe) == {"stable": 40, "deviate": 7, "warmup": 15,
                                             "vote_pruned": False}
    assert (stopping.esc.window, stopping.adaptive_consistency.threshold) == (8, 0.95)


# DeepConf issue 15: six paths, four of them right in four different forms of sqrt(2)/2;
# by string "1" (2 votes) beats each form (1 vote), by cluster sqrt(2)/2 wins 4 to 2
SIX = ["1", "\\frac{\\sqrt2}{2}", "\\frac{1}{\\sqrt2}", "1", "\\sqrt2/2", "\\sqrt{0.5}"]
CANON = [canonical(a, "boxed") for a in SIX]
GOLD = canonical("\\frac{\\sqrt{2}}{2}", "boxed")
RIGHT = np.array([equivalent(a, GOLD, "boxed") for a in CANON])


def six_paths(answer_format):
    return Paths(group=np.zeros(6, int), path_id=np.arange(6), length=np.full(6, 10),
                 correct=RIGHT, answer=np.array(CANON, dtype=object),
                 text=np.array([f"path {j}" for j in range(6)], dtype=object),
                 alive=np.ones(6, bool), batch={}, answer_format=answer_format)


def test_the_six_paths_are_four_right_forms():
    assert len(set(CANON)) == 5 and RIGHT.tolist() == [False, True, True, False, True, True]


def test_votes_count_equivalent_answers_as_one():
    assert vote(CANON) == "1"  # by string: the split vote of the issue
    assert vote(CANON, "boxed") == CANON[1]  # the cluster, represented by its first form
    assert cons_at_n([CANON], [GOLD]) == 0.0 and cons_at_n([CANON], [GOLD], "boxed") == 1.0


@pytest.mark.parametrize("empty", ["", "  ", "\n", None])
def test_empty_answers_never_vote(empty):
    from stopexp.core.voting import elect
    from stopexp.metrics import majority_vote

    assert majority_vote([empty, empty, "5"]) == "5" == vote([empty, empty, "5"], "boxed")
    assert vote([empty, empty]) is None and majority_vote([]) is None
    assert cons_at_n([[empty, empty, "5"], [empty]], ["5", "7"]) == 0.5
    assert elect([empty, empty, "5"]) == "5"
    # weighted: the empty answers' weights (0.9, 0.9) beat the one "5" (0.1) but do not vote
    assert elect([empty, empty, "5"], np.array([2.2, 2.2, -2.2]), "weighted") == "5"
    # filtered: the top two are empty, so nothing that votes is left
    assert elect([empty, empty, "5"], np.array([2.0, 1.0, 0.0]), "filtered", top=0.5) is None
    assert elect([empty, empty, "5"], np.array([2.0, 1.0, 0.0]), "filtered", top=1.0) == "5"


@pytest.mark.parametrize("grader", ["equivalent", "exact"])
def test_blank_answers_of_an_answers_bank_never_vote_or_agree(tmp_path, grader):
    bank = [{"question": "1 + 1?", "gold_answer": "2", "probe_freq": 10, "each_branch": [
        [[" "], 10, " "], [["\t"], 10, ""], [[None], 10, "  "], [["2"], 10, "2"]]}]
    (tmp_path / "b.json").write_text(json.dumps(bank))
    p = load_answers_bank(tmp_path / "b.json", grader=grader).prompts[0]
    assert p.final.tolist() == [0, 0, 0, 1] and vote_codes(p.final) == 1
    assert esc(p, np.arange(4), window=2).launched == 4  # two blanks are no unanimous window
    assert adaptive_consistency(p, np.arange(4), threshold=0.7).answer == 1


@pytest.mark.parametrize("rule", ["majority", "weighted", "filtered"])
def test_outcome_votes_by_cluster(rule):
    signal = np.zeros(6)  # equal weights; filtered with vote_top 1 keeps everyone
    for fmt, right in ((None, False), ("boxed", True)):
        o = outcome(six_paths(fmt), np.ones(6, bool), 5, 6, vote=rule, signal=signal, vote_top=1.0)
        assert o["correct"].tolist() == [right]
        assert o["chosen"].tolist() == ["path 1" if right else "path 0"]  # the cluster's first path


def test_stopping_protocols_vote_by_cluster():
    confs = [np.ones(10)] * 6
    settings = {"esc": {"window": 4}, "deepconf_top": {"keep_percent": 100}}
    names = ["esc", "adaptive_consistency", "deepconf_weighted", "deepconf_top"]
    for fmt, right in ((None, False), ("boxed", True)):
        o = stopping_outcomes(six_paths(fmt), confs, names, 6, settings, 2)
        # ESC (window 4): (1, a, b, 1) is split and (c, d) the last window; ASC's posterior
        # never passes 3/4 (after the first path): all six vote, by string or by cluster
        assert all(o[m]["voter"].all() and o[m]["correct"].tolist() == [right] for m in names)


def answers_bank_of(tmp_path, finals):
    """One prompt whose branches answer `finals`, 30 tokens each, probed every 10 tokens
    with their final answer."""
    data = [{"question": "q", "gold_answer": "\\frac{\\sqrt{2}}{2}", "probe_freq": 10,
             "each_branch": [[[a, a], 30, a] for a in finals]}]
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(data))
    return load_answers_bank(path).prompts[0]


def test_answers_bank_codes_clusters_for_every_method(tmp_path):
    p = answers_bank_of(tmp_path, SIX)
    assert p.answers == ["", "1", CANON[1]] and p.correct.tolist() == [False, False, True]
    assert p.final.tolist() == [1, 2, 2, 1, 2, 2]
    order = np.arange(6)
    assert vote_codes(p.final) == 2 and no_prune(p, order).answer == 2
    assert esc(p, order, window=4).answer == 2
    assert adaptive_consistency(p, order).answer == 2
    # the leader is the cluster (4 to 2) at probes 2 and 3: stable, all stop at 30 tokens
    d = parallel_probe(p, order, stable=1, deviate=3, warmup=0)
    assert d.answer == 2 and d.spent.tolist() == [30] * 6


def test_consensus_stops_on_equivalent_answers(tmp_path):
    p = answers_bank_of(tmp_path, SIX[1:3] + SIX[4:] + ["1", "1"])  # the four forms first
    d = esc(p, np.arange(6), window=4)  # the first window is unanimous by cluster
    assert (d.launched, int(d.spent.sum()), bool(p.correct[d.answer])) == (4, 120, True)
    d = adaptive_consistency(p, np.arange(6))  # four alike: 31/32 >= 0.95 at the 4th
    assert (d.launched, bool(p.correct[d.answer])) == (4, True)


def test_bank_summary_votes_by_cluster(monkeypatch):
    class Bank(dict):
        column_names = ["correct"]

    ds = Bank(split=["test"] * 6, prompt_id=[0] * 6, correct=RIGHT.tolist(), answer=CANON,
              length=[10] * 6)
    monkeypatch.setattr(bank_plan.bank, "load_bank", lambda root: ds)
    assert bank_plan.summarize_bank(Path("bank"))["vote_accuracy"] == 0.0
    assert bank_plan.summarize_bank(Path("bank"), "boxed")["vote_accuracy"] == 1.0
