"""The analyses evaluate adds per method: wrongly pruned paths, vote flips against
no_prune, and the length-matched within-prompt AUROC (hand-computed)."""
import math

import numpy as np
import pytest

from stopexp.evaluation.analyses import (add_analyses, length_matched_auroc, vs_no_prune,
                                         wrongly_pruned)


def test_wrongly_pruned_share():
    stopped = np.array([True, True, False, True, False])
    correct = np.array([True, False, True, False, False])
    assert wrongly_pruned(stopped, correct) == {"pruned_paths": 3, "wrongly_pruned": pytest.approx(1 / 3)}
    assert wrongly_pruned(np.zeros(3, bool), correct[:3]) == {"pruned_paths": 0, "wrongly_pruned": None}


def test_vote_flips_and_token_spread():
    base = {"correct": np.array([True, True, False, False]), "tokens": np.array([100, 100, 100, 50])}
    m = {"correct": np.array([True, False, True, False]), "tokens": np.array([30, 50, 20, 50])}
    r = vs_no_prune(m, base)
    assert (r["improved"], r["worsened"], r["unchanged"]) == (1, 1, 2)
    assert r["tokens_ratio_p50"] == pytest.approx(0.4)  # ratios 0.3, 0.5, 0.2, 1.0


def test_length_matched_auroc_keeps_only_pairs_of_similar_length():
    # prompt 0: right paths of length 100 and 50, wrong ones of length 105 and 20. Only
    # (100, 105) is matched (5 <= 10.5); the score tracks length, so it ranks 105 above 100.
    scores = np.array([100.0, 50, 105, 20, 1, 2])
    correct = np.array([True, True, False, False, True, False])
    length = np.array([100, 50, 105, 20, 10, 10])
    group = np.array([0, 0, 0, 0, 1, 1])
    # prompt 1: (10, 10) matched, the wrong path scores higher: 0 as well
    assert length_matched_auroc(scores, correct, length, group) == (0.0, 2)
    # a tie counts one half; a prompt without a matched pair is left out
    assert length_matched_auroc(np.array([1.0, 1.0, 3, 4]), np.array([True, False, True, False]),
                                np.array([10, 10, 10, 100]), np.array([0, 0, 1, 1])) == (0.5, 1)
    value, pairs = length_matched_auroc(np.array([1.0, 2]), np.array([True, False]),
                                        np.array([10, 50]), np.array([0, 0]))
    assert math.isnan(value) and pairs == 0
    # NaN scores rank lowest
    assert length_matched_auroc(np.array([1.0, np.nan]), np.array([True, False]), np.array([10, 10]),
                                np.array([0, 0]))[0] == 1.0


def test_add_analyses_fills_every_method():
    from stopexp.store.path_table import Paths

    paths = Paths(group=np.array([0, 0, 0]), path_id=np.arange(3), length=np.array([10, 10, 30]),
                  correct=np.array([True, False, True]), answer=np.array(["1", "2", "1"], dtype=object),
                  text=np.array(["", "", ""], dtype=object), alive=np.ones(3, bool), batch={})
    outcome = lambda stopped, right, tokens: {"stopped": np.array(stopped),  # noqa: E731
                                              "correct": np.array([right]), "tokens": np.array([tokens])}
    outcomes = {"no_prune": outcome([False] * 3, True, 50), "score": outcome([True, False, False], False, 30)}
    results = {"no_prune": {}, "score": {}}
    add_analyses(results, outcomes, {"score": np.array([0.0, 1.0, 2.0])}, paths, 3)
    assert results["score"]["wrongly_pruned"] == 1.0 and results["score"]["pruned_paths"] == 1
    assert results["score"]["vs_no_prune"]["worsened"] == 1
    diff = results["score"]["vs_no_prune"]["accuracy_diff"]  # one prompt, right -> wrong
    assert diff["diff"] == -1.0 and diff["ci"] == [-1.0, -1.0] and diff["prompts"] == 1
    assert results["score"]["auroc_length_matched"] == 0.0  # (10 right, 10 wrong): wrong above
    assert results["no_prune"]["wrongly_pruned"] is None and "auroc_length_matched" not in results["no_prune"]


def test_pareto_colours_stay_distinct_for_twenty_methods():
    from stopexp.evaluation.figures import studied_methods, styles

    names = ["no_prune", "random", "confidence", "conf_features", "oracle", "mlp", "linear",
             *[f"signal{i}" for i in range(13)]]
    style = styles(names, studied_methods(names, "signal0"))
    assert len({str(style[n]["color"]) for n in names}) == 20
