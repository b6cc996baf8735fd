"""DeepConf online (early termination), its votes, and evaluate's stopping protocols on
hand-made paths (window 2)."""

import numpy as np
import pytest

from stopexp.store.path_table import Paths
from stopexp.stopping import deepconf as dc
from stopexp.stopping.replay import stopping_outcomes

# prompt 0: two warm-up paths (lowest group confidence 2 and 4 -> threshold at the 50th
# percentile: 3), then a path that falls below at token 4, one that stays at 3, one
# shorter than a window; gold 8. Prompt 1: four paths, answers 5 5 6 5, gold 5.
CONFS = [[3, 3, 1, 3], [4, 4, 4], [5, 5, 2, 2, 5], [3, 3, 3], [1]] + [[1.0] * 10] * 4
ANSWERS = ["7", "8", "8", "7", "9", "5", "5", "6", "5"]
SETTINGS = {"esc": {"window": 2}, "adaptive_consistency": {"threshold": 0.85},
            "deepconf_online": {"warmup": 2, "keep_percent": 50}, "deepconf_top": {"keep_percent": 50}}


@pytest.fixture
def paths():
    lengths = np.array([len(c) for c in CONFS])
    return Paths(group=np.array([0] * 5 + [1] * 4), path_id=np.array([0, 1, 2, 3, 4, 0, 1, 2, 3]),
                 length=lengths, correct=np.array([a in ("8", "5") for a in ANSWERS]),
                 answer=np.array(ANSWERS, dtype=object), text=np.array(ANSWERS, dtype=object),
                 alive=lengths > 1, batch={})


def test_group_confidence_and_stop_point():
    assert dc.window_means([3, 3, 1, 3], 2).tolist() == [3, 2, 2]
    assert dc.lowest_group_conf([3, 3, 1, 3], 2) == 2
    assert dc.lowest_group_conf([1, 2], 3) == 1.5  # shorter than a window: the mean
    assert dc.stop_point([5, 5, 2, 2, 5], 2, 3.0) == 4  # window (2, 2) ends at token 4
    assert dc.stop_point([3, 3, 3], 2, 3.0) == 3  # never below: runs to the end
    # a copy of a warm-up path at the threshold, its confidences rounded otherwise (the
    # engine's live ones against the bank's), is at the threshold, not below
    assert dc.stop_point([3, 3 - 1e-6, 3], 2, 3.0) == 3
    assert dc.stop_point([3, 3 - 1e-3, 3], 2, 3.0) == 2


def test_online_threshold_and_stops():
    spent, voter, lowest, threshold = dc.online([np.array(c, float) for c in CONFS[:5]], 2, 50, 2)
    assert threshold == 3.0
    assert lowest.tolist() == [2, 4, 2, 3, 1]
    assert spent.tolist() == [4, 3, 4, 3, 1]
    assert voter.tolist() == [True, True, False, True, True]  # the short path cannot be stopped
    with pytest.raises(ValueError, match=r"warm-up: 5 paths must lie in 1..4"):
        dc.online([np.ones(3)] * 5, 5, 50, 2)


def test_votes():
    assert dc.weighted_vote(["7", "8", "", "7"], [1, 3, 9, 1]) == "8"
    assert dc.weighted_vote(["7", "8"], [2, 2]) == "7"  # a tie: the first seen
    assert dc.weighted_vote(["", None], [1, 1]) is None
    assert dc.top_share(np.array([2, 4, 2, 3, 1]), 40).tolist() == [False, True, False, True, False]
    assert dc.top_share(np.array([2, 4]), 1).tolist() == [False, True]  # at least one


def test_stopping_outcomes_by_hand(paths):
    confs = [np.array(c, float) for c in CONFS]
    o = stopping_outcomes(paths, confs, ["esc", "adaptive_consistency", "deepconf_online",
                                         "deepconf_weighted", "deepconf_top"], 5, SETTINGS, 2)
    # DeepConf online, prompt 0: voters 7 (2 + 3), 8 (4), 9 (1) -> 7, wrong; prompt 1: no stop
    assert o["deepconf_online"]["correct"].tolist() == [False, True]
    assert o["deepconf_online"]["tokens"].tolist() == [15, 40]
    assert o["deepconf_online"]["pruned_at"].tolist() == [4]
    # weighted over all: 8 has 4 + 2 against 7's 2 + 3; the top 50% (3 paths: confidence 4,
    # 3, and of the two 2s the first) give 7 (3 + 2) against 8 (4)
    assert o["deepconf_weighted"]["correct"].tolist() == [True, True]
    assert o["deepconf_top"]["correct"].tolist() == [False, True]
    assert o["deepconf_top"]["tokens"].tolist() == [16, 40]  # every path still runs
    # ESC (window 2): prompt 0's first window 7, 8 is split, the second 8, 7 too, the third
    # (9) has one path: all sampled; prompt 1's first window 5, 5 is unanimous
    assert o["esc"]["tokens"].tolist() == [16, 20] and o["esc"]["correct"].tolist() == [False, True]
    # Adaptive-Consistency (0.85): prompt 1 stops at 2 alike (7/8), prompt 0 never passes
    assert o["adaptive_consistency"]["tokens"].tolist() == [16, 20]
    assert o["adaptive_consistency"]["alive_at_check"] == pytest.approx(7 / 9)


@pytest.mark.parametrize("override, message", [
    ("evaluate.stopping.esc.window=0", "evaluate.stopping.esc.window: must be >= 1, got 0"),
    ("evaluate.stopping.adaptive_consistency.threshold=1.5",
     r"evaluate.stopping.adaptive_consistency.threshold: must lie in \(0, 1\], got 1.5"),
    ("evaluate.stopping.deepconf_top.keep_percent=0",
     r"evaluate.stopping.deepconf_top.keep_percent: must lie in \(0, 100\]"),
    ("evaluate.stopping.deepconf_online.warmup=8", r"evaluate.stopping.deepconf_online.warmup: 8 "
                                                   r"reaches the 8 paths of a prompt \(search.n_paths\); "
                                                   r"give at most 7"),
])
def test_stopping_settings_fail_before_compute(override, message):
    from conftest import compose
    from stopexp.config import ConfigError, validate

    with pytest.raises(ConfigError, match=message):
        validate(compose("evaluate", ["search.n_paths=8", "policy.keep=4", "evaluate.n_points=[8]",
                                      "evaluate.retention=[4]", override]))
    assert validate(compose("evaluate", ["search.n_paths=8", "policy.keep=4", "evaluate.n_points=[8]",
                                         "evaluate.retention=[4]",
                                         "evaluate.stopping.deepconf_online.warmup=0.25"]))


def test_a_warm_up_share_is_at_least_one_path_and_one_path_is_refused_with_the_fix():
    from conftest import compose
    from stopexp.config import ConfigError, validate
    from stopexp.core.protocol import warmup_paths

    assert [warmup_paths(0.25, n) for n in (2, 3, 8, 64)] == [1, 1, 2, 16] and warmup_paths(0, 8) == 0
    assert validate(compose("evaluate", ["search.n_paths=2"])).search.n_paths == 2  # one edit shrinks
    with pytest.raises(ConfigError, match="needs search.n_paths >= 2: drop deepconf_online from evaluate.methods"):
        validate(compose("evaluate", ["search.n_paths=1"]))


@pytest.mark.parametrize("override, message", [
    ("evaluate.esc_window=4", "evaluate.esc_window: moved: set evaluate.stopping.esc.window=4"),
    ("evaluate.combined_first=8", "evaluate.combined_first: moved: set evaluate.stopping.combined.first=8"),
    ("evaluate.deepconf_keep_percent=90", "evaluate.deepconf_keep_percent: moved: set "
                                          "evaluate.stopping.deepconf_online.keep_percent and/or "
                                          "evaluate.stopping.deepconf_top.keep_percent"),
])
def test_a_stopping_setting_of_its_old_name_says_where_it_moved(override, message):
    from stopexp.config import ConfigError
    from stopexp.runtime.overrides import check_overrides

    with pytest.raises(ConfigError) as e:
        check_overrides("evaluate", [override])
    assert str(e.value) == message
