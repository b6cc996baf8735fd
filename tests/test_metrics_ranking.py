"""Metrics of path scores: AUROC and AUPRC (pooled, within prompt, per prompt) against
sklearn, non-finite scores ranked at the extremes, bootstrap intervals, calibration (ECE,
Brier, reliability) and the vote metrics (majority, cons@n, avg@k, pass@1)."""
import time

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from stopexp.metrics import (auprc, auroc, avg_at_k, bootstrap_ci, bootstrap_over_groups, brier,
                             cons_at_n, ece, length_correlation, majority_vote, nonfinite,
                             pass_at_1, per_group_auroc, pooled_auroc, reliability,
                             within_prompt_auroc)


def test_auroc_auprc_equal_sklearn_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 300).astype(float)  # few levels: many ties
    labels = rng.random(300) < 0.4
    assert auroc(scores, labels) == roc_auc_score(labels, scores)
    assert auprc(scores, labels) == average_precision_score(labels, scores)
    assert auroc(list(scores), list(labels.astype(int))) == roc_auc_score(labels, scores)
    assert pooled_auroc(scores, labels) == auroc(scores, labels)


@pytest.mark.parametrize("positives", [10, 20, 21, 30])
def test_a_perfect_ranking_stays_within_the_bound_of_one(positives):
    # every positive above the negative: average precision is 1, which sklearn's sum of
    # `positives` steps misses by a few ulps either way (1.0000000000000002 for 20 and 21
    # here); a sum of <= 31 terms <= 1 errs by <= 31 ulps (7e-15), hence the tolerance
    labels = [1] * positives + [0]
    scores = np.arange(positives + 1, 0, -1.0)
    for value in (auroc(scores, labels), auprc(scores, labels)):
        assert 0.0 <= value <= 1.0 and value == pytest.approx(1.0, abs=1e-12)


def test_auroc_single_class_is_nan():
    assert np.isnan(auroc([0.1, 0.7], [1, 1]))
    assert np.isnan(auroc([0.1, 0.7], [0, 0]))
    assert np.isnan(auprc([0.1, 0.7], [0, 0]))


def test_within_prompt_auroc_hand_example():
    scores = [0.9, 0.1, 0.8, 0.2, 0.3, 0.3, 0.5, 0.6]
    labels = [1, 0, 1, 0, 1, 0, 1, 1]
    groups = ["a", "a", "a", "a", "b", "b", "c", "c"]  # a: 1.0, b (a tie): 0.5, c: skipped
    assert within_prompt_auroc(scores, labels, groups) == 0.75
    keys, values = per_group_auroc(scores, labels, groups)
    assert list(keys) == ["a", "b", "c"]
    assert values[:2].tolist() == [1.0, 0.5] and np.isnan(values[2])
    assert np.isnan(within_prompt_auroc([0.1, 0.2], [1, 0], [0, 1]))  # no mixed prompt


def test_per_group_auroc_equals_sklearn_per_group():
    rng = np.random.default_rng(1)
    groups = rng.permutation(np.repeat(np.arange(30), 12))  # groups interleaved
    scores = rng.integers(0, 4, len(groups)).astype(float)
    labels = rng.random(len(groups)) < 0.5
    keys, values = per_group_auroc(scores, labels, groups)
    for k, v in zip(keys, values):
        m = groups == k
        expected = roc_auc_score(labels[m], scores[m]) if 0 < labels[m].sum() < m.sum() else None
        assert np.isnan(v) if expected is None else v == pytest.approx(expected, abs=1e-12)


def test_prompt_only_score_is_chance_within_prompt():
    # A score that only knows how hard each prompt is (constant within a prompt).
    rng = np.random.default_rng(2)
    difficulty = rng.random(100)
    groups = np.repeat(np.arange(100), 8)
    labels = rng.random(len(groups)) > difficulty[groups]
    scores = -difficulty[groups]
    assert within_prompt_auroc(scores, labels, groups) == 0.5
    assert pooled_auroc(scores, labels) > 0.75


BIG = 1e300  # a finite stand-in for inf that sklearn accepts: same order, same ties


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_nonfinite_scores_rank_at_the_extremes(bad):
    rng = np.random.default_rng(6)
    scores = rng.random(60)
    labels = rng.random(60) < 0.5
    scores[[3, 10, 11]] = bad
    scores[20] = -np.inf
    stand_in = np.where(np.isnan(scores), -BIG, np.clip(scores, -BIG, BIG))  # NaN ranks with -inf
    assert auroc(scores, labels) == roc_auc_score(labels, stand_in)
    assert auprc(scores, labels) == average_precision_score(labels, stand_in)
    groups = np.repeat(np.arange(6), 10)
    _, per = per_group_auroc(scores, labels, groups)
    _, expected = per_group_auroc(stand_in, labels, groups)
    assert per.tolist() == pytest.approx(expected.tolist(), abs=1e-12)
    assert np.isfinite(per[1]) and np.isfinite(within_prompt_auroc(scores, labels, groups))
    assert nonfinite(scores) == 4


def test_nan_scores_rank_lowest_within_a_prompt():
    # the prompt is kept (not dropped) and its NaN path counts as the lowest score
    assert within_prompt_auroc([np.nan, 0.2, 0.9], [0, 0, 1], [0, 0, 0]) == 1.0
    assert within_prompt_auroc([np.nan, 0.2, 0.9], [1, 0, 0], [0, 0, 0]) == 0.0
    assert auroc([np.inf, -np.inf], [1, 0]) == 1.0
    assert length_correlation([1, 2, np.nan, 3, np.inf], [1, 2, 9, 3, 9]) == pytest.approx(1.0)
    assert ece([np.nan, 1.0], [0, 1]) == 0.0 and brier([np.nan], [1]) == 1.0  # NaN counts as 0
    assert np.isnan(length_correlation([np.nan, np.inf, 1.0], [1, 2, 3]))
    with pytest.raises(ValueError, match=r"probabilities must lie in \[0, 1\]; got values from -0.5 to 1.0"):
        ece([-0.5, 1.0], [0, 1])


def test_policies_treat_nan_as_lowest_and_survive_infinities():
    import torch

    from stopexp.core.policies import Quantile, TopK

    s = torch.tensor([float("nan"), 0.2, 0.9, float("-inf"), float("inf")])
    assert TopK(3).keep(s).tolist() == [False, True, True, False, True]
    assert Quantile(0.5).keep(s).tolist() == [False, False, True, False, True]  # median of finite


def test_evaluate_signal_quality_counts_nonfinite_scores():
    from stopexp.store.path_table import Paths
    from stopexp.evaluation.accounting import signal_quality

    n = 8
    paths = Paths(group=np.repeat([0, 1], 4), path_id=np.tile(np.arange(4), 2), length=np.full(n, 10),
                  correct=np.array([1, 0, 1, 0, 1, 1, 0, 0], bool), answer=np.full(n, "", object),
                  text=np.full(n, "", object), alive=np.ones(n, bool), batch={})
    scores = np.array([np.inf, np.nan, 0.5, 0.1, 0.9, 0.8, -np.inf, np.nan])
    q = signal_quality(paths, scores, 4, n_boot=50, seed=0)
    assert q["auroc"] == 1.0 and q["auroc_pooled"] == 1.0 and q["nonfinite_scores"] == 4


def test_length_correlation():
    assert length_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert length_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(length_correlation([1, 1, 1], [1, 2, 3]))


def test_bootstrap_ci_contains_estimate_narrows_and_is_deterministic():
    rng = np.random.default_rng(3)
    few, many = rng.random(20), rng.random(500)
    lo, hi = bootstrap_ci(few)
    assert lo < few.mean() < hi
    lo2, hi2 = bootstrap_ci(many)
    assert lo2 < many.mean() < hi2
    assert hi2 - lo2 < (hi - lo) / 2
    assert bootstrap_ci(few, seed=7) == bootstrap_ci(few, seed=7) != bootstrap_ci(few, seed=8)


def test_bootstrap_over_groups_matches_bootstrap_ci():
    values = np.random.default_rng(4).random(50)
    groups = np.repeat(np.arange(50), 3)
    lo, hi = bootstrap_over_groups(lambda idx: values[idx].mean(), groups, n=300, seed=5)
    assert (lo, hi) == pytest.approx(bootstrap_ci(values, n=300, seed=5), abs=1e-12)


def test_bootstrap_ci_is_fast():
    values = np.random.default_rng(5).random(200)
    start = time.perf_counter()
    bootstrap_ci(values, n=1000)
    assert time.perf_counter() - start < 0.5


def test_bootstrap_leaves_nan_resamples_out_and_counts_them(caplog):
    # 30 prompts, 25 without the statistic (NaN): resamples that draw only those are NaN
    values = np.r_[np.full(25, np.nan), np.linspace(0.1, 0.5, 5)]
    groups = np.arange(30)
    stat = lambda idx: np.nanmean(values[idx]) if np.isfinite(values[idx]).any() else np.nan  # noqa: E731
    ci = bootstrap_over_groups(stat, groups, n=2000, seed=1)
    draws = np.random.default_rng(1).integers(0, 30, size=(2000, 30))  # the same resamples
    by_hand = np.array([stat(d) for d in draws])
    nan = np.isnan(by_hand)
    assert ci.nan_resamples == int(nan.sum()) > 0
    assert tuple(ci) == tuple(np.quantile(by_hand[~nan], [0.025, 0.975]))
    assert "resamples have a NaN statistic; the interval uses the others" in caplog.text
    # np.mean over NaN values: every resample holding one is left out (np.nanmean skips them)
    ci = bootstrap_ci(np.r_[np.nan, np.linspace(0, 1, 99)], n=500, seed=2)
    assert 0 < ci.nan_resamples < 500 and np.isfinite(ci).all()
    none = bootstrap_ci([np.nan, np.nan], n=50)
    assert none.nan_resamples == 50 and np.isnan(none).all()
    assert "is NaN (no resample has the statistic)" in caplog.text
    assert bootstrap_ci(np.linspace(0, 1, 20)).nan_resamples == 0


def test_ece_brier_reliability_hand_example():
    probs, labels = [0.15, 0.15, 0.85, 0.85], [0, 1, 1, 1]
    # bin 1: confidence 0.15, accuracy 0.5; bin 8: confidence 0.85, accuracy 1.0
    assert ece(probs, labels) == pytest.approx(0.5 * 0.35 + 0.5 * 0.15)
    assert brier(probs, labels) == pytest.approx((3 * 0.15**2 + 0.85**2) / 4)
    r = reliability(probs + [1.0], labels + [1])  # p == 1 lands in the last bin
    assert r["counts"].tolist() == [0, 2, 0, 0, 0, 0, 0, 0, 2, 1]
    assert r["accuracy"][1] == 0.5 and r["confidence"][8] == pytest.approx(0.85)
    assert np.isnan(r["accuracy"][0]) and np.isnan(r["confidence"][5])
    assert r["bin_centers"][0] == pytest.approx(0.05)
    assert ece([1.0, 0.0], [1, 0]) == 0.0


def test_majority_vote_ties_and_none():
    assert majority_vote([3, 5, 5, 3]) == 3  # tie: first seen wins
    assert majority_vote([None, None, None, 4]) == 4  # None never wins
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_cons_avg_pass():
    answers = [[1, 1, 2], [None, None], [3, 4, 4]]
    assert cons_at_n(answers, [1, None, 4]) == pytest.approx(2 / 3)  # no answer is wrong
    assert avg_at_k([[1, 0], [1, 1, 1, 0], []]) == pytest.approx((0.5 + 0.75 + 0) / 3)
    assert pass_at_1([[True, False], [True]]) == 0.75
