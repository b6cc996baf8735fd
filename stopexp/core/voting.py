"""A path's signal across checks (`search.score_rule`) and how the voting paths of one
prompt elect an answer (`evaluate.vote`); replay and online both use this module.

Score rule: a path's score at a check is its newest raw score (`last`) or the running
mean of its raw scores at this and all its earlier checks (`running_mean`, STEP's trace
score, arXiv 2601.09093). Its final signal is that score at the last check it passed.

- `majority`: self-consistency; every voter counts 1, ties go to the answer seen first
  (path order).
- `weighted`: a voter counts sigmoid(s), s its final signal (the score it had at the last
  check it passed, under `search.score_rule`): DeepConf's confidence-weighted vote
  (arXiv 2508.15260) and STEP's score-weighted vote (arXiv 2601.09093). For a learned
  predictor s is a logit, so the weight is its probability of success; for other scores it
  is a positive weight that grows with the score. Ties go to the answer seen first.
- `filtered`: a majority vote among the top `vote_top` share of the scored voters
  (ceil(vote_top * n), at least one; ties to the earlier path), DeepConf's top-eta% vote.

A voter without a score is a path that ended before the first check (Launch-Check-Resume
sends it straight to the vote): under `weighted` it weighs the mean weight of the prompt's
scored voters (every voter weighs 1 when none was scored, i.e. majority); under `filtered`
it always votes. Signals are rounded as the policies round them (stopexp.core.policies.quantize),
so replayed and online scores that differ in the last float bits vote alike; NaN ranks
lowest (weight 0).

Every caller first replaces each answer by its cluster's representative
(stopexp.metrics.answers.vote_clusters, under the task's `vote_format`), so that equivalent
answers (``\\frac{\\sqrt{2}}{2}``, ``\\sqrt{2}/2``) are one candidate; `elect` then counts
strings.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from stopexp.core.errors import ConfigError
from stopexp.core.policies import quantize
from stopexp.core.config_text import has_answer

VOTES = ("majority", "weighted", "filtered")
SCORE_RULES = ("last", "running_mean")


def rule_score(history: list, rule: str) -> float:
    """A path's score at a check from its raw scores at this and earlier checks (float64,
    in check order): the newest (`last`), or their running mean (`running_mean`: STEP's
    trace score, arXiv 2601.09093). Replay and online both call it."""
    return float(history[-1]) if rule == "last" else float(np.mean(np.asarray(history, np.float64)))


def weights(signal: np.ndarray) -> np.ndarray:
    """(n,) sigmoid of the rounded signals (NaN -> -inf -> 0)."""
    s = quantize(torch.as_tensor(np.asarray(signal, dtype=np.float64))).numpy()
    return 1.0 / (1.0 + np.exp(-s))


def elect(answers, signal: np.ndarray | None = None, rule: str = "majority",
          top: float = 0.5) -> object:
    """The winning answer of one prompt's voters (None: no voter has an answer). `answers`:
    per voter its answer (clustered: see the module doc), None, "" or whitespace for none (no
    answer never votes); `signal`: (n,) final signals,
    NaN for a voter never scored (needed unless rule is majority); `top`: the share in
    (0, 1] that votes under `filtered`. ValueError on an unknown rule, a missing signal or
    one of another length than `answers`, and a `top` outside (0, 1]."""
    if rule not in VOTES:
        raise ConfigError(f"evaluate.vote: {rule!r} unknown; allowed: {', '.join(VOTES)}")
    answers = list(answers)
    n = len(answers)
    if rule != "majority" and (signal is None or np.shape(signal) != (n,)):
        raise ConfigError(f"evaluate.vote={rule} needs one signal per voter: {n} voters, signal "
                          f"{'None' if signal is None else np.shape(signal)}")
    if rule == "filtered" and not 0 < top <= 1:
        raise ConfigError(f"evaluate.vote_top: must lie in (0, 1], got {top}")
    weight = np.ones(n)
    if rule != "majority" and n:
        signal = np.asarray(signal, dtype=np.float64)
        scored = ~np.isnan(signal)
        if rule == "weighted" and scored.any():
            w = weights(signal[scored])
            weight[scored] = w
            weight[~scored] = w.mean()
        elif rule == "filtered" and scored.any():
            idx = np.nonzero(scored)[0]
            s = quantize(torch.as_tensor(signal[idx])).numpy()
            order = idx[np.argsort(-s, kind="stable")]
            chosen = order[: max(1, math.ceil(top * len(idx)))]
            weight[scored] = 0.0
            weight[chosen] = 1.0
    counts: dict = {}
    for a, w in zip(answers, weight):
        if has_answer(a) and (w > 0 or rule == "weighted"):  # filtered: only the top share
            counts[a] = counts.get(a, 0.0) + float(w)
    return max(counts, key=counts.get) if counts else None
