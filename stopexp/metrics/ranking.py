"""Ranking metrics for a score that should separate doomed paths (label 0) from good ones.

Within-prompt AUROC is the primary metric: pruning only ever chooses among the paths of
one prompt, while a pooled AUROC also rewards knowing which prompts are hard.

Non-finite scores (a scorer plugged in with `register_external` may return them): +inf
and -inf rank as the highest and lowest scores; NaN ranks lowest, tied with -inf (the
path a pruning policy would drop first; `stopexp.core.policies` treats NaN the same way). All
ranking metrics depend only on the order of the scores, so they are computed on ranks;
callers report how many scores were not finite (`nonfinite`).
"""
from __future__ import annotations

import logging
import math

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import average_precision_score, roc_auc_score

from stopexp.metrics.bounds import clip_to_range
from stopexp.metrics.multiplicity import bootstrap_p

log = logging.getLogger(__name__)


def nonfinite(scores) -> int:
    """How many scores are NaN or +-inf (reported next to the metrics as `nonfinite_scores`)."""
    return int((~np.isfinite(np.asarray(scores, dtype=float))).sum())


def _arrays(scores, labels):
    """(finite ranks of the scores, bool labels): NaN ranks with -inf, at the bottom."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels).astype(bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must be equal-length 1-d")
    if not np.isfinite(s).all():
        s = rankdata(np.where(np.isnan(s), -np.inf, s))  # order and ties kept: same AUROC
    return s, y


def auroc(scores, labels) -> float:
    """Area under the ROC curve; NaN when only one class is present."""
    s, y = _arrays(scores, labels)
    if y.all() or not y.any():
        return float("nan")
    return float(clip_to_range([roc_auc_score(y, s)], "AUROC")[0][0])  # sklearn's sums round


pooled_auroc = auroc


def auprc(scores, labels) -> float:
    """Average precision (sklearn's step-wise area, in [0, 1]: sklearn's sum of steps
    rounds to 1.0000000000000002 for 20 positives ranked above 1 negative); NaN without
    any positive."""
    s, y = _arrays(scores, labels)
    if not y.any():
        return float("nan")
    return float(clip_to_range([average_precision_score(y, s)], "AUPRC")[0][0])


def _mann_whitney_auc(s: np.ndarray, y: np.ndarray) -> float:
    # Midranks make this equal to sklearn's trapezoidal ROC area, ties included, at a
    # fraction of roc_auc_score's per-call overhead (it runs once per prompt).
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((rankdata(s)[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def per_group_auroc(scores, labels, groups) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique groups, AUROC of each group's items); NaN for single-outcome groups."""
    s, y = _arrays(scores, labels)
    g = np.asarray(groups)
    if g.shape != s.shape:
        raise ValueError(f"groups {g.shape} must match scores {s.shape}")
    keys, inverse = np.unique(g, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(keys)))[:-1]
    values = [_mann_whitney_auc(s[i], y[i]) for i in np.split(order, bounds)]
    return keys, np.asarray(values, dtype=float)


def within_prompt_auroc(scores, labels, groups) -> float:
    """Mean AUROC over the groups (prompts) that have both outcomes; NaN if none does."""
    _, values = per_group_auroc(scores, labels, groups)
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else float("nan")


def _resamples(n_groups: int, n: int, seed: int) -> np.ndarray:
    """(n, n_groups) group indices drawn with replacement; shared so that both bootstrap
    helpers draw the same resamples for the same seed."""
    return np.random.default_rng(seed).integers(0, n_groups, size=(n, n_groups))


class Interval(tuple):
    """A bootstrap CI, (lo, hi), with `nan_resamples`: how many resamples had a NaN
    statistic and were left out (a resample drawing only prompts without the statistic,
    e.g. no prompt with mixed outcomes for a within-prompt AUROC)."""

    def __new__(cls, lo: float, hi: float, nan_resamples: int = 0):
        out = super().__new__(cls, (lo, hi))
        out.nan_resamples = nan_resamples
        return out


def _interval(stats, alpha: float) -> Interval:
    """Percentile interval of the resamples' statistics that are not NaN (a NaN one has no
    place in the order); NaN bounds when none is. Logs how many were left out."""
    stats = np.asarray(stats, dtype=float)
    nan = np.isnan(stats)
    if nan.any():
        log.warning("bootstrap: %d of %d resamples have a NaN statistic; the interval %s",
                    int(nan.sum()), len(stats), "uses the others" if not nan.all() else
                    "is NaN (no resample has the statistic)")
    if nan.all():
        return Interval(float("nan"), float("nan"), int(nan.sum()))
    lo, hi = np.quantile(stats[~nan], [alpha / 2, 1 - alpha / 2])
    return Interval(float(lo), float(hi), int(nan.sum()))


def bootstrap_ci(values_per_group, stat=np.mean, n: int = 1000, seed: int = 0,
                 alpha: float = 0.05) -> Interval:
    """Percentile CI of `stat` over groups resampled with replacement (one value per
    prompt). `stat` must be a numpy-style reduction taking `axis=`; all resamples are
    reduced in one call. Resamples whose statistic is NaN are left out and counted
    (`Interval.nan_resamples`); with NaN values, pass np.nanmean to skip them instead."""
    v = np.asarray(values_per_group, dtype=float)
    return _interval(stat(v[_resamples(len(v), n, seed)], axis=1), alpha)


def bootstrap_over_groups(fn, groups, n: int = 1000, seed: int = 0,
                          alpha: float = 0.05) -> Interval:
    """Percentile CI of `fn(idx)`, where `idx` indexes the sorted unique `groups` (with
    repeats) of one resample, for statistics that are not a plain reduction of one value
    per group, e.g. ``lambda idx: np.nanmean(per_group_values[idx])`` (NaN where the
    resample drew only NaN groups: left out and counted, as in `bootstrap_ci`)."""
    n_groups = len(np.unique(np.asarray(groups)))
    return _interval([fn(idx) for idx in _resamples(n_groups, n, seed)], alpha)


def paired_difference(a_per_group, b_per_group, n: int = 1000, seed: int = 0,
                      alpha: float = 0.05) -> dict:
    """The paired difference a - b of two methods measured on the same groups (prompts),
    one value per group each (NaN where a group has no value, e.g. an AUROC of a prompt
    whose paths all end right or all wrong): `diff` the mean over the groups where both
    have a value, `ci` its percentile bootstrap CI (`bootstrap_ci` of the per-group
    differences: the groups resampled once, each drawn with both methods' values),
    `p` the two-sided p of a zero difference from the same resamples
    (`stopexp.metrics.multiplicity.bootstrap_p`: the interval inverted), `prompts` the
    groups used and `excluded` those left out. NaN where none is left."""
    a, b = np.asarray(a_per_group, dtype=float), np.asarray(b_per_group, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values {a.shape} and {b.shape} must be equal-length 1-d")
    d = (a - b)[~(np.isnan(a) | np.isnan(b))]
    if not len(d):
        return {"diff": float("nan"), "ci": [float("nan")] * 2, "p": float("nan"), "prompts": 0,
                "excluded": int(len(a))}
    stats = d[_resamples(len(d), n, seed)].mean(axis=1)  # bootstrap_ci's resamples
    lo, hi = _interval(stats, alpha)
    return {"diff": float(d.mean()), "ci": [float(lo), float(hi)], "p": bootstrap_p(stats),
            "prompts": int(len(d)), "excluded": int(len(a) - len(d))}


def length_correlation(scores, lengths) -> float:
    """Pearson correlation of a score with path length (a score that merely tracks length
    is a cheap baseline in disguise), over the paths with a finite score; NaN when either
    is constant."""
    s, n = np.asarray(scores, dtype=float), np.asarray(lengths, dtype=float)
    finite = np.isfinite(s)
    s, n = s[finite], n[finite]
    if len(s) < 2 or s.std() == 0 or n.std() == 0:
        return float("nan")
    return float(np.corrcoef(s, n)[0, 1])


def reward_ranking(scores, rewards, groups) -> dict:
    """How well a score orders paths by a continuous reward, within each prompt (group):

    spearman_within     mean Spearman rho between score and reward over the prompts whose
                        reward is not constant (scipy.stats.spearmanr)
    kendall_within      the same with Kendall's tau-b (scipy.stats.kendalltau)
    auroc_above_median  mean within-prompt AUROC of the score for "reward above the prompt's
                        median reward" (prompts with paths on both sides)
    prompts_ranked      how many prompts the two correlations average over

    A score constant within such a prompt orders nothing: it counts as 0 there. Scores
    rank as in the AUROC (NaN lowest, +-inf at the extremes). NaN where no prompt qualifies."""
    from scipy.stats import kendalltau, spearmanr

    s = np.asarray(scores, dtype=float)
    r = np.asarray(rewards, dtype=float)
    g = np.asarray(groups)
    if not (s.shape == r.shape == g.shape) or s.ndim != 1:
        raise ValueError(f"scores {s.shape}, rewards {r.shape} and groups {g.shape} must be "
                         "equal-length 1-d")
    if not np.isfinite(s).all():
        s = rankdata(np.where(np.isnan(s), -np.inf, s))
    rho, tau, above, labels = [], [], [], np.zeros(len(s), bool)
    for key in np.unique(g):
        rows = np.nonzero(g == key)[0]
        rs, ss = r[rows], s[rows]
        labels[rows] = rs > np.median(rs)
        if len(rows) < 2 or np.ptp(rs) == 0:
            continue
        if np.ptp(ss) == 0:
            rho.append(0.0)
            tau.append(0.0)
            continue
        rho.append(float(spearmanr(ss, rs).statistic))
        tau.append(float(kendalltau(ss, rs).statistic))
    above = within_prompt_auroc(s, labels, g)
    mean = (lambda v: float(np.mean(v)) if v else float("nan"))
    return {"spearman_within": mean(rho), "kendall_within": mean(tau),
            "auroc_above_median": above, "prompts_ranked": len(rho)}


def is_binary(labels) -> bool:
    """Every label is 0 or 1 (an outcome), so AUROC is the ranking metric to report."""
    v = np.asarray(labels, dtype=float)
    return bool(np.isin(v[np.isfinite(v)], (0.0, 1.0)).all())


def auroc_by_position(scores, correct, group, position) -> dict:
    """Per stored position (ascending): the within-prompt AUROC of `scores` against
    `correct` over the rows at that position (mean over prompt `group`s with both outcomes
    there; NaN where none has both) and the number of such prompts. All arguments (B,).
    Returns {"positions": [int], "auroc": [float], "n_mixed_prompts": [int]}."""
    s, y = np.asarray(scores, dtype=float), np.asarray(correct) > 0.5
    g, pos = np.asarray(group), np.asarray(position)
    out = {"positions": [], "auroc": [], "n_mixed_prompts": []}
    for p in np.unique(pos):
        at = pos == p
        _, values = per_group_auroc(s[at], y[at], g[at])
        mixed = values[~np.isnan(values)]
        out["positions"].append(int(p))
        out["auroc"].append(float(mixed.mean()) if len(mixed) else math.nan)
        out["n_mixed_prompts"].append(int(len(mixed)))
    return out
