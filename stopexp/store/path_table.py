"""The evaluated paths of a split as every method's accounting reads them (`Paths`: one row
per path, grouped by prompt, loaded from the trace bank by
stopexp.evaluation.accounting.replay_paths or made by an online run) and what a method's
checks did to them (`Pruning`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Paths:
    """The evaluated paths, one row each, grouped by prompt (rows of a prompt contiguous,
    ordered by path id)."""
    group: np.ndarray    # prompt index 0..G-1
    path_id: np.ndarray
    length: np.ndarray   # tokens the path generates when not pruned
    correct: np.ndarray
    answer: np.ndarray   # extracted answers ("" = none)
    text: np.ndarray
    alive: np.ndarray    # still generating at the check
    batch: dict          # predictor batch at the check, for every row
    prompt_ids: np.ndarray | None = None  # the task's prompt id of each group (None: 0..G-1)
    prompt_len: np.ndarray | None = None  # prompt tokens (for the KV-memory estimate; None online)
    checks: list | None = None  # replay: the predictor batch at every check (checks[0] is batch)
    reward: np.ndarray | None = None      # each path's reward (stopexp/tasks/rewards.py)
    lm_score: np.ndarray | None = None    # mean log-prob of its generated tokens (selection)
    answer_format: str | None = None      # equivalent answers vote as one (tasks.vote_format)
    thinking: np.ndarray | None = None    # a thinking model's thinking tokens per path (None: not one)


@dataclass
class Pruning:
    """What a method's checks did to every path (one row per path, as in `Paths`)."""
    kept: np.ndarray       # alive at the first check and never pruned
    pruned_at: np.ndarray  # prefix tokens of the check that pruned the path (0: not pruned)
    signal: np.ndarray     # final signal: the score at the last check it passed (NaN: never scored)
