"""Analyses of each method's pruning that evaluate adds to metrics.json, next to accuracy
and tokens:

- `wrongly_pruned`: of the paths a method stopped before their end (pruned at the check,
  or stopped early by a stopping protocol), the share that would have ended correct (the
  bank knows how every path ends); `pruned_paths` counts them.
- `vs_no_prune`: per prompt, the method's vote against no_prune's on the same paths:
  prompts that improved (no_prune wrong, method right), worsened and stayed; and the spread
  of the per-prompt token ratio (10th, 50th, 90th percentile). For the learned signal this
  is the per-prompt spread of its gain over no_prune.
- `auroc_length_matched`: within-prompt AUROC over the pairs (one path that ends correct,
  one that does not, both live at the check) whose final lengths differ by at most 10% of
  the longer one, averaged over prompts with such a pair. A signal that only tracks
  the final length falls to 0.5 here. NaN scores rank lowest, as in
  `stopexp.metrics.ranking`.
"""
from __future__ import annotations

import numpy as np

from stopexp.metrics import paired_difference

LENGTH_TOLERANCE = 0.10


def wrongly_pruned(stopped: np.ndarray, correct: np.ndarray) -> dict:
    """stopped, correct: (P,) bool per path."""
    n = int(stopped.sum())
    return {"pruned_paths": n,
            "wrongly_pruned": float(correct[stopped].mean()) if n else None}


def vs_no_prune(method: dict, base: dict, n_boot: int = 1000, seed: int = 0) -> dict:
    """method, base: outcome dicts (per prompt "correct" and "tokens"); n_boot, seed: the
    paired bootstrap's."""
    m, b = method["correct"].astype(bool), base["correct"].astype(bool)
    ratio = method["tokens"] / np.maximum(base["tokens"], 1)
    p10, p50, p90 = np.percentile(ratio, [10, 50, 90]).tolist()
    return {"improved": int((m & ~b).sum()), "worsened": int((~m & b).sum()),
            "unchanged": int((m == b).sum()),
            "tokens_ratio_p10": p10, "tokens_ratio_p50": p50, "tokens_ratio_p90": p90,
            "accuracy_diff": paired_difference(m.astype(float), b.astype(float), n_boot, seed)}


def length_matched_auroc(scores: np.ndarray, correct: np.ndarray, length: np.ndarray,
                         group: np.ndarray, tolerance: float = LENGTH_TOLERANCE) -> tuple[float, int]:
    """(mean over prompts of the AUROC over length-matched pairs, number of such pairs).
    All arrays (P,) over the paths to compare (live at the check); NaN when no prompt has
    a matched pair. Ties count one half."""
    s = np.where(np.isnan(scores), -np.inf, np.asarray(scores, float))
    per, pairs = [], 0
    for g in np.unique(group):
        rows = np.nonzero(group == g)[0]
        pos, neg = rows[correct[rows]], rows[~correct[rows]]
        if not len(pos) or not len(neg):
            continue
        lp, ln = length[pos][:, None].astype(float), length[neg][None, :].astype(float)
        match = np.abs(lp - ln) <= tolerance * np.maximum(lp, ln)
        if not match.any():
            continue
        sp, sn = s[pos][:, None], s[neg][None, :]
        wins = (sp > sn) + 0.5 * (sp == sn)
        per.append(float(wins[match].mean()))
        pairs += int(match.sum())
    return (float(np.mean(per)) if per else float("nan")), pairs


def add_analyses(results: dict, outcomes: dict, scores: dict, paths, n: int,
                 n_boot: int = 1000, seed: int = 0) -> None:
    """Add the analyses above to every method's entry of `results` (in place). outcomes:
    name -> outcome dict with a "stopped" (P,) mask; scores: name -> (P,) scores; paths: the
    evaluated Paths; n: paths per prompt; n_boot, seed: the paired bootstrap's."""
    correct = paths.correct.astype(bool)
    live = paths.alive & (paths.path_id < n)
    for name, o in outcomes.items():
        r = results[name]
        r.update(wrongly_pruned(o["stopped"], correct))
        r["vs_no_prune"] = vs_no_prune(o, outcomes["no_prune"], n_boot, seed)
        if name in scores:
            r["auroc_length_matched"], r["length_matched_pairs"] = length_matched_auroc(
                scores[name][live], correct[live], paths.length[live], paths.group[live])
