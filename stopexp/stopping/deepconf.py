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
  the choice open, the wrapper defaults to 90, keep_percent here to 10).
  Every other path stops after the first token whose window (full, ending at that token)
  has a group confidence below the threshold (by more than float rounding: TIE), and leaves
  the vote; the warm-up paths and the paths that finished vote, weighted by their lowest
  group confidence.
  warmup (a quarter of N), search.group_window (8) and search.conf_topk
  (5; the wrapper reads 20 log-probs) are this project's, sized to the toy's short paths.
- Offline votes over N finished paths: `weighted` (each path's vote weighs its lowest group
  confidence) and `top` (the weighted vote among the keep_percent % most confident paths,
  at least one).
Replaying on stored per-token confidences is exact: every path has its own random stream,
so a path that is not stopped continues exactly as it was collected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from stopexp.core.limits import count
from stopexp.core.protocol import warmup_paths
from stopexp.stopping.method import StoppingMethod, within

KEEP_PERCENT = 10.0  # DeepConf-low (see the module doc), for online and the top-share vote
SOURCE = "arXiv 2508.15260"


@dataclass
class DeepConfOnline(StoppingMethod):
    """DeepConf online's settings: warmup, the warm-up paths per prompt (below 1: a share
    of N; this project's 0.25, see the module doc), and keep_percent (the threshold is the
    (100 - keep_percent)-th percentile of their lowest group confidences)."""
    warmup: float = field(default=0.25, metadata=count("n_paths", share=True, below=True))
    keep_percent: float = KEEP_PERCENT
    name: ClassVar[str] = "deepconf_online"
    source: ClassVar[str] = SOURCE
    banks: ClassVar[tuple[str, ...]] = ("traces",)
    inside: ClassVar[bool] = True

    def problems(self, n=None):
        out = {"warmup": None if self.warmup > 0 else f"must be > 0, got {self.warmup}",
               "keep_percent": within(self.keep_percent, 0, 100, low_open=True)}
        k = warmup_paths(self.warmup, n) if n is not None else None
        if out["warmup"] is None and k is not None and not 1 <= k < n:
            out["warmup"] = (f"{self.warmup} gives {k} warm-up paths; they must lie in "
                             f"1..{n - 1} (below search.n_paths)"
                             + ("; set it to a count below search.n_paths" if n > 1 else
                                "; DeepConf online needs search.n_paths >= 2: drop "
                                "deepconf_online from evaluate.methods"))
        return out

    def replay(self, r) -> dict:
        """The warm-up paths run first and set the stopping bar, then the rest together."""
        spent, voter = np.asarray(r.paths.length).copy(), np.zeros(len(r.paths.length), bool)
        wave = np.zeros(len(voter), np.int64)
        warm = warmup_paths(self.warmup, r.n)
        for rows in r.prompt_rows():
            spent[rows], voter[rows], _, _ = online([r.confs[i] for i in rows], warm,
                                                    self.keep_percent, r.group_window)
            wave[rows] = np.arange(len(rows)) >= warm
        return r.outcome(spent, voter, wave, r.lowest)

    def controller(self, n: int, group_window: int, **_) -> "OnlineStops":
        """The engine-side protocol (stopexp.search.inpath) for `n` paths per prompt."""
        return OnlineStops(warmup_paths(self.warmup, n), self.keep_percent, group_window)


class OnlineStops:
    """DeepConf online as the engine runs it (stopexp.search.inpath): the `warmup` paths of
    each prompt run to their end first; their lowest group confidences set the prompt's
    threshold; every later path stops at the end of its first full window below it (the
    token that completed the window spent, as `stop_point` counts it). Voters weigh their
    lowest group confidence."""

    def __init__(self, warmup: int, keep_percent: float, window: int):
        self.warmup, self.keep_percent, self.window = warmup, keep_percent, window
        self.threshold: dict = {}   # prompt -> its threshold, once its warm-up paths ended
        self.weights: dict = {}     # (prompt, path id) -> lowest group confidence
        self.checked: dict = {}     # (prompt, path id) -> tokens whose window was checked

    def waves(self, n: int) -> list[range]:
        return [range(self.warmup), range(self.warmup, n)]

    def stops(self, stepper, prompt, paths) -> list:
        threshold = self.threshold.get(prompt)
        if threshold is None:  # warm-up paths are never stopped
            return []
        out = []
        for p, (_, _, conf) in zip(paths, stepper.columns(paths)):
            # the windows ending after those already checked, computed as replay computes them
            done = max(self.checked.get(p.key, 0), self.window - 1)
            self.checked[p.key] = len(conf)
            below = np.nonzero(is_below(window_means(conf, self.window)[done - self.window + 1:], threshold))[0]
            if len(below):
                out.append((p, done + 1 + int(below[0])))
        return out

    def wave_done(self, stepper, wave: int, prompt, paths) -> None:
        ran = [p for p in paths if not p.pruned]
        for p, (_, _, conf) in zip(ran, stepper.columns(ran)):
            self.weights[p.key] = lowest_group_conf(conf, self.window)
        if wave == 0:
            lowest = [self.weights[p.key] for p in sorted(paths, key=lambda p: p.key)]
            self.threshold[prompt] = float(np.percentile(lowest, 100 - self.keep_percent))


@dataclass
class DeepConfWeighted(StoppingMethod):
    """DeepConf's confidence-weighted vote over all N finished paths (no settings)."""
    name: ClassVar[str] = "deepconf_weighted"
    source: ClassVar[str] = SOURCE
    banks: ClassVar[tuple[str, ...]] = ("traces",)

    def replay(self, r) -> dict:
        return r.outcome(r.paths.length, np.ones(len(r.paths.length), bool), weight=r.lowest)


@dataclass
class DeepConfTop(StoppingMethod):
    """DeepConf's weighted vote among the keep_percent % most confident of all N paths."""
    keep_percent: float = KEEP_PERCENT
    name: ClassVar[str] = "deepconf_top"
    source: ClassVar[str] = SOURCE
    banks: ClassVar[tuple[str, ...]] = ("traces",)

    def problems(self, n=None):
        return {"keep_percent": within(self.keep_percent, 0, 100, low_open=True)}

    def replay(self, r) -> dict:
        voter = np.zeros(len(r.paths.length), bool)
        for rows in r.prompt_rows():
            voter[rows] = top_share(r.lowest[rows], self.keep_percent)
        return r.outcome(np.asarray(r.paths.length).copy(), voter, np.zeros(len(voter), np.int64),
                         r.lowest)


# a group confidence within this relative distance of the threshold is at it, not below:
# a path equal to a warm-up path (whose lowest group confidence is the threshold) has the
# same windows up to float rounding, which differs between the engine's live confidences
# and the bank's stored ones (other batch shapes), and must not be stopped by one and kept
# by the other
TIE = 1e-5


def is_below(values, threshold: float) -> np.ndarray:
    """Group confidences below `threshold` by more than float rounding (TIE)."""
    return np.asarray(values, np.float64) < threshold - TIE * abs(threshold)


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
    below = np.nonzero(is_below(window_means(conf, window), threshold))[0]
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
    voter = warm | ~is_below(lowest, threshold) | np.asarray([len(c) < window for c in confs])
    spent = np.asarray([len(c) if v else stop_point(c, window, threshold)
                        for c, v in zip(confs, voter)], np.int64)
    return spent, voter, lowest, threshold
