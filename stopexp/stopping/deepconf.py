"""DeepConf (Fu et al., "Deep Think with Confidence", arXiv 2508.15260): early termination
of low-confidence paths during generation, and its confidence-aware votes.

Token confidence is -mean log-prob of the top-k candidates (`search.conf_topk`); a group
confidence is the mean token confidence over a window of `window` tokens
(`search.group_window`; the paper uses 2048); a path's *lowest group confidence* is the
minimum over its full windows (the mean over the path when it is shorter), exactly as
`stopexp.signals.confidence` computes it.

- Online: the first `warmup` paths of a prompt (16 in the paper and in
  facebookresearch/deepconf deepconf/wrapper.py `warmup_traces=16`) run to the end; the
  threshold is the (100 - keep_percent)-th percentile of their lowest group confidences
  (keep_percent = 10: DeepConf-low, 90: DeepConf-high; the paper reports both and leaves
  the choice open, the wrapper defaults to 90, evaluate.deepconf_keep_percent to 10).
  Every other path stops after the first token whose window (full, ending at that token)
  has a group confidence below the threshold, and leaves the vote; the warm-up paths and
  the paths that finished vote, weighted by their lowest group confidence.
  evaluate.deepconf_warmup (a quarter of N), search.group_window (8) and search.conf_topk
  (5; the wrapper reads 20 log-probs) are this project's, sized to the toy's short paths.
- Offline votes over N finished paths: `weighted` (each path's vote weighs its lowest group
  confidence) and `top` (the weighted vote among the keep_percent % most confident paths,
  at least one).
Replaying on stored per-token confidences is exact: every path has its own random stream,
so a path that is not stopped continues exactly as it was collected.
"""
from __future__ import annotations

import math

import numpy as np


def window_means(conf: np.ndarray, window: int) -> np.ndarray:
    """(L - window + 1,) group confidences of the full windows; entry i ends at token
    i + window (1-based); empty when the path is shorter than the window."""
    conf = np.asarray(conf, np.float64)
    if len(conf) < window:
        return conf[:0]
    csum = np.concatenate([[0.0], np.cumsum(conf)])
    return (csum[window:] - csum[:-window]) / window


def lowest_group_conf(conf: np.ndarray, window: int) -> float:
    """The minimum group confidence over full windows; the mean when the path is shorter
    than one window (nan for an empty path)."""
    means = window_means(conf, window)
    if len(means):
        return float(means.min())
    return float(np.mean(conf)) if len(conf) else math.nan


def stop_point(conf: np.ndarray, window: int, threshold: float) -> int:
    """Tokens a path generates before DeepConf online stops it: the end of the first full
    window whose group confidence is below `threshold`, else its full length."""
    below = np.nonzero(window_means(conf, window) < threshold)[0]
    return int(below[0]) + window if len(below) else len(conf)


def weighted_vote(answers, weights) -> object:
    """The answer with the largest total weight ("" / None never wins; ties go to the
    answer seen first); None when no path has an answer."""
    total: dict = {}
    for a, w in zip(answers, weights):
        if a:
            total[a] = total.get(a, 0.0) + float(w)
    return max(total, key=total.get) if total else None


def top_share(weights: np.ndarray, keep_percent: float) -> np.ndarray:
    """Bool mask of the ceil(keep_percent % of n) paths with the largest weights (at least
    one; ties broken by position)."""
    weights = np.asarray(weights, np.float64)
    k = max(1, math.ceil(len(weights) * keep_percent / 100))
    mask = np.zeros(len(weights), bool)
    mask[np.argsort(-weights, kind="stable")[:k]] = True
    return mask


def online(confs: list[np.ndarray], warmup: int, keep_percent: float, window: int):
    """DeepConf online on one prompt's paths, in launch order. Returns (spent (n,) tokens
    each path generated, voter (n,) bool, weight (n,) lowest group confidence, threshold)."""
    if not 1 <= warmup < len(confs):
        raise ValueError(f"deepconf warm-up: {warmup} paths must lie in 1..{len(confs) - 1} "
                         f"(the prompt has {len(confs)})")
    if not 0 < keep_percent <= 100:
        raise ValueError(f"deepconf keep_percent must be in (0, 100], got {keep_percent}")
    lowest = np.asarray([lowest_group_conf(c, window) for c in confs])
    threshold = float(np.percentile(lowest[:warmup], 100 - keep_percent))
    warm = np.arange(len(confs)) < warmup
    # a path is stopped when some window falls below: then its lowest one does too
    voter = warm | ~(lowest < threshold) | np.asarray([len(c) < window for c in confs])
    spent = np.asarray([len(c) if v else stop_point(c, window, threshold)
                        for c, v in zip(confs, voter)], np.int64)
    return spent, voter, lowest, threshold
