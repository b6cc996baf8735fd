"""Every method against a baseline per task of a mixture: the paired difference of their
per-prompt values over each task's prompts, the intervals corrected for the number of tasks
looked at (Holm: the task with the smallest bootstrap p-value at alpha / m, the next at
alpha / (m - 1), ...), with the number of prompts per task."""
from __future__ import annotations

import numpy as np

from stopexp.metrics.ranking import paired_difference


def bootstrap_p(diffs: np.ndarray, n: int, seed: int) -> float:
    """Two-sided bootstrap p-value of a mean difference of zero (prompts resampled)."""
    d = diffs[np.isfinite(diffs)]
    if not len(d):
        return float("nan")
    means = d[np.random.default_rng(seed).integers(0, len(d), (n, len(d)))].mean(axis=1)
    return float(min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean())))


def holm_levels(p: dict, alpha: float = 0.05) -> dict:
    """key -> the level its interval is drawn at under Holm's step-down over `p` (NaN last)."""
    order = sorted(p, key=lambda k: (not np.isfinite(p[k]), p[k]))
    return {k: alpha / (len(order) - i) for i, k in enumerate(order)}


def per_task(a: np.ndarray, b: np.ndarray, tasks: np.ndarray, labels: list[str], n_boot: int,
             seed: int) -> dict:
    """label -> a - b over its prompts (`a`, `b`, `tasks`: one value per prompt), its
    Holm-corrected interval and the prompts it was measured on (`paired_difference`)."""
    p = {label: bootstrap_p(a[tasks == k] - b[tasks == k], n_boot, seed)
         for k, label in enumerate(labels)}
    levels = holm_levels(p)
    out = {}
    for k, label in enumerate(labels):
        out[label] = {**paired_difference(a[tasks == k], b[tasks == k], n_boot, seed, levels[label]),
                      "p": p[label], "level": levels[label], "task_prompts": int((tasks == k).sum())}
    return out
