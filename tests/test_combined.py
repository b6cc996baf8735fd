"""The combined stopping controller (stopexp.stopping.combined): decisions computed by hand
on small cases, its equality with Adaptive-Consistency where it reads nothing else, its
trace-bank replay, and the one-line errors of its knobs."""
import json

import numpy as np
import pytest

from conftest import compose
from stopexp.config import validate
from stopexp.core.errors import ConfigError
from stopexp.store.path_table import Paths
from stopexp.stopping.adaptive_consistency import adaptive_consistency
from stopexp.stopping.answers_bank import load_answers_bank
from stopexp.stopping.branch_draws import build_methods
from stopexp.stopping.combined import (Timeline, answers_timeline, combined, combined_answers,
                                       stability)
from stopexp.stopping.replay import stopping_outcomes

NEVER = {"settle": float("inf"), "prune_below": float("-inf")}  # read finals only, never prune


def timeline(final, tokens, marks, signal):
    """A trace-bank-like prompt: no answer before a path ends, `signal` (n, T)."""
    final, tokens, marks = (np.asarray(x, np.int64) for x in (final, tokens, marks))
    end = np.searchsorted(marks, tokens, side="left")
    answers = np.where(np.arange(len(marks))[None, :] >= end[:, None], final[:, None], 0)
    return Timeline(final=final, tokens=tokens, marks=marks, end=end, answers=answers,
                    signal=np.asarray(signal, float))


def test_stops_when_the_leader_is_certain_and_prunes_a_low_signal_path():
    # marks 10, 20, 30; wave 0 = paths 0..3. Step 0: path 0 ends (answer 1): P(Beta(2, 1) >
    # 1/2) = 3/4 >= prune_confidence 0.7, so path 3 (signal -1 < 0, no answer yet) is pruned
    # at 10 tokens. Step 1: paths 1 and 2 end (1, 1): 3 to 0, 15/16 >= 0.9: stop, answer 1.
    tl = timeline([1, 1, 1, 2, 1, 1], [10, 20, 20, 30, 40, 40], [10, 20, 30],
                  [[5] * 3, [5] * 3, [5] * 3, [-1] * 3, [5] * 3, [5] * 3])
    r = combined(tl, first=4, wave=2, threshold=0.9, settle=0, prune_below=0, prune_confidence=0.7)
    assert r.answer == 1 and r.spent.tolist() == [10, 20, 20, 10, 0, 0] and r.launched == 4
    assert r.voter.tolist() == [True, True, True, False, False, False]
    assert r.wave.tolist() == [0, 0, 0, 0, 1, 1]


def test_launches_a_wave_while_the_evidence_is_thin():
    # wave 0 (paths 0, 1) ends split 1:1: P = 1/2; with threshold 0.5 that is certain enough
    tl = timeline([1, 2, 1, 1], [10, 10, 20, 20], [10, 20], [[0] * 2] * 4)
    r = combined(tl, first=2, wave=2, threshold=0.5, **NEVER)
    assert (r.answer, r.launched, r.spent.tolist()) == (1, 2, [10, 10, 0, 0])
    # with 0.9 it is thin: wave 1 runs, 3 to 1 gives 26/32 < 0.9, no path is left: the vote
    r = combined(tl, first=2, wave=2, threshold=0.9, prune_confidence=0.95, **NEVER)
    assert (r.answer, r.launched, r.spent.tolist()) == (1, 4, [10, 10, 20, 20])
    assert r.voter.all()


def answers_prompt(tmp_path, branches, gold="5"):
    data = [{"question": "q", "gold_answer": gold, "probe_freq": 100, "each_branch": branches}]
    (tmp_path / "bank.json").write_text(json.dumps(data))
    return load_answers_bank(tmp_path / "bank.json").prompts[0]


def test_settled_intermediate_answers_count_and_unstable_dissent_is_pruned(tmp_path):
    # two branches say 5 at every probe, the third wanders 7, 8, 7; settle 2: from probe 2 the
    # two 5s count (P(Beta(3, 1) > 1/2) = 7/8); the wanderer (stability 1 < 2, answer 8) is
    # pruned at probe 2 (200 tokens); nothing else settles the vote until both 5s end
    p = answers_prompt(tmp_path, [[["5", "5", "5"], 350, "5"], [["5", "5", "5"], 350, "5"],
                                  [["7", "8", "7"], 350, "7"]])
    tl = answers_timeline(p, np.arange(3))
    assert tl.marks.tolist() == [100, 200, 300, 400] and tl.end.tolist() == [3, 3, 3]
    assert tl.signal[2].tolist() == [1, 1, 1, 2] and tl.signal[0].tolist() == [1, 2, 3, 4]
    knobs = dict(first=3, wave=1, settle=2, prune_below=2, prune_confidence=0.7)
    d = combined_answers(p, np.arange(3), threshold=0.9, **knobs)
    assert p.answers[d.answer] == "5" and d.spent.tolist() == [350, 350, 200]
    # 7/8 is certain enough at 0.85: every branch stops at probe 2 with the settled leader
    d = combined_answers(p, np.arange(3), threshold=0.85, **knobs)
    assert p.answers[d.answer] == "5" and d.spent.tolist() == [200, 200, 200]


def test_stability_counts_probes_of_one_readable_answer():
    assert stability(np.array([[1, 1, 0, 2, 2, 2]])).tolist() == [[1, 2, 0, 1, 2, 3]]


def test_one_path_waves_reading_finals_only_is_adaptive_consistency(tmp_path):
    rng = np.random.default_rng(0)
    branches = [[[], int(t), str(a)] for t, a in zip(rng.integers(50, 400, 40), rng.integers(1, 4, 40))]
    p = answers_prompt(tmp_path, branches, gold="1")
    for s in range(20):
        order = rng.permutation(40)[:24]
        for th in (0.8, 0.95):
            a = adaptive_consistency(p, order, th)
            c = combined_answers(p, order, first=1, wave=1, threshold=th, **NEVER)
            assert (c.answer, c.launched, c.spent.tolist()) == (a.answer, a.launched, a.spent.tolist())


def test_trace_bank_replay_votes_the_finished_paths():
    # one prompt, checks at 5 and 10 tokens; paths in path-id order; the signal at the two
    # checks is row i's score. Wave 0 = paths 0..2: at check 0 path 0 has ended (answer 7):
    # 3/4 >= 0.7 prunes path 2 (score -1) at 5; at check 1 path 1 ends (7): 7/8 < 0.9; after
    # the last check nothing runs: wave 1 (path 3, 30 tokens) runs to its end: 3 to 0 -> stop
    paths = Paths(group=np.zeros(5, int), path_id=np.arange(5), length=np.array([4, 8, 30, 30, 9]),
                  correct=np.array([1, 1, 0, 1, 0], bool), answer=np.array(["7", "7", "3", "7", "3"], object),
                  text=np.array([f"p{i}" for i in range(5)], object), alive=np.ones(5, bool), batch={})
    settings = {"combined": {"first": 3, "wave": 1, "threshold": 0.9, "prune_below": 0.0,
                             "prune_confidence": 0.7}}
    signal = [np.array([1, 1, -1, 1, 1.0]), np.array([1, 1, -1, 1, 1.0])]
    o = stopping_outcomes(paths, [np.ones(1)] * 5, ["combined"], 5, settings, 2, [5, 10], signal)["combined"]
    assert o["spent"].tolist() == [4, 8, 5, 30, 0] and o["voter"].tolist() == [1, 1, 0, 1, 0]
    assert o["correct"].tolist() == [True] and o["tokens"].tolist() == [47.0]


@pytest.mark.parametrize("arg, message", [
    ("stopping.combined.first=0", r"stopping.combined.first: must be an integer >= 1, got 0"),
    ("stopping.combined.threshold=1.5", r"stopping.combined.threshold: must be in \(0, 1\], got 1.5"),
    ("stopping.combined.prune_confidence=0", r"stopping.combined.prune_confidence: must be in \(0, 1\]"),
    ("stopping.combined.settle=nan", r"stopping.combined.settle: must be a number"),
    ("stopping.combined.wave=2.5", r"stopping.combined.wave: Value '2.5' of type 'float' could not be "
                                   "converted to Integer"),
])
def test_answers_replay_knobs_fail_by_name(arg, message):
    from stopexp.runtime.overrides import check_overrides

    with pytest.raises(ConfigError, match=message):
        check_overrides("answers_replay", ["bank=b.json", arg], validate_run=True)


def test_build_methods_checks_the_knobs_before_the_bank():
    with pytest.raises(ConfigError, match="stopping.combined.first: must be an integer >= 1"):
        build_methods(["combined"], 1, 1, {"combined": {"first": 0}})


def test_the_defaults_are_the_tuned_setting_on_both_kinds_of_bank():
    # scripts/tune_combined.py's choice on AIME24 (docs/answers-only.md#the-combined-controller)
    tuned = {"first": 4, "wave": 2, "threshold": 0.95, "prune_below": 8.0, "prune_confidence": 0.75}
    assert dict(compose("evaluate").evaluate.stopping.combined) == {"signal": "learned", **tuned}
    assert dict(compose("answers_replay", ["bank=b.json"]).stopping.combined) == {**tuned, "settle": 40.0}


@pytest.mark.parametrize("override, message", [
    ("evaluate.stopping.combined.signal=oracle_x",
     r"evaluate.stopping.combined.signal: 'oracle_x' is not a scoring method"),
    ("evaluate.stopping.combined.signal=esc", r"evaluate.stopping.combined.signal: 'esc' is not a scoring method"),
    ("evaluate.stopping.combined.threshold=0", r"evaluate.stopping.combined.threshold: must be in \(0, 1\]"),
    ("evaluate.stopping.combined.wave=0", r"evaluate.stopping.combined.wave: must be an integer >= 1"),
    ("evaluate.mode=online", r"evaluate.methods: combined reads every check's scores"),
])
def test_evaluate_knobs_fail_at_validate(override, message):
    cfg = compose("evaluate", ["evaluate.methods=[learned,esc,combined]", override])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_evaluate_signal_may_be_an_always_run_method():
    assert validate(compose("evaluate", ["evaluate.methods=[combined]",
                                         "evaluate.stopping.combined.signal=confidence"]))



def test_evaluate_signal_learned_is_the_configured_predictor_by_either_name():
    validate(compose("evaluate", ["evaluate.methods=[mlp,combined]"]))  # signal=learned
    validate(compose("evaluate", ["evaluate.methods=[learned,combined]",
                                  "evaluate.stopping.combined.signal=mlp"]))
    with pytest.raises(ConfigError, match="evaluate.stopping.combined.signal: 'learned' is not a "
                                          "scoring method"):
        validate(compose("evaluate", ["evaluate.methods=[linear,combined]"]))  # predictor=mlp
