"""Every method against a baseline per task of a mixture: the paired difference of their
per-prompt values over each task's prompts, with the number of prompts per task, the tasks
one family under Holm's correction (stopexp.metrics.multiplicity: p and p_holm beside each
raw interval, `holm` where it survives)."""
from __future__ import annotations

import numpy as np

from stopexp.metrics.multiplicity import correct_family
from stopexp.metrics.ranking import paired_difference


def per_task(a: np.ndarray, b: np.ndarray, tasks: np.ndarray, labels: list[str], n_boot: int,
             seed: int) -> dict:
    """label -> a - b over its prompts (`a`, `b`, `tasks`: one value per prompt;
    `paired_difference`), corrected over the tasks, and the prompts of its task."""
    out = {label: {**paired_difference(a[tasks == k], b[tasks == k], n_boot, seed),
                   "task_prompts": int((tasks == k).sum())}
           for k, label in enumerate(labels)}
    correct_family(list(out.values()))
    return out
