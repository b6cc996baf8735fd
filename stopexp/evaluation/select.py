"""Selection instead of voting, for tasks without a single answer (data-to-text): a
prompt's final output is one of the paths that run to the end (the kept paths and those
that ended before the check), chosen by `evaluate.select`:

    vote      majority vote over the answers (the default; stopexp.evaluation.accounting.outcome)
    signal    the kept path with the best score of the method at the check; a method with
              no score of its own (no_prune), or a prompt whose every path ended before the
              check, falls back to lm_score
    lm_score  the path with the best LM score: the mean log-prob of its generated tokens
              (the bank's token_logprob)
    oracle    the path with the best true reward (stopexp/tasks/rewards.py): an upper bound

Ties go to the lowest path id. Besides the choice this module adds what selection is
judged by: the paths' rewards and LM scores read from the bank (online runs reproduce the
bank's paths, checked text by text; a path that does not gets none), the within-prompt rank
correlations of a method's scores with a continuous reward, and the comparison of every chosen output with plain
beam search's (stopexp.evaluation.beam, pruning off, the same prompts).
"""
from __future__ import annotations

import logging

import numpy as np

from stopexp.core.errors import ConfigError
from stopexp.store import bank

log = logging.getLogger(__name__)

SELECT_MODES = ("vote", "signal", "lm_score", "oracle")


def lm_scores(token_logprobs) -> np.ndarray:
    """(P,) mean log-prob of each path's generated tokens (NaN for a path without any)."""
    return np.asarray([float(np.mean(lp)) if len(lp) else np.nan for lp in token_logprobs])


def pick(rows: np.ndarray, mode: str, kept_rows: np.ndarray, scores: np.ndarray | None,
         lm_score: np.ndarray | None, reward: np.ndarray | None) -> int:
    """The row (an index of `rows`' paths) that `mode` selects among the finishing `rows`
    of one prompt; `kept_rows` is the subset that was alive at the check and kept. NaN
    never wins unless all are NaN. ValueError when the mode's values are missing."""
    if mode == "signal" and scores is not None and len(kept_rows):
        rows, values = kept_rows, scores[kept_rows]
    elif mode in ("signal", "lm_score"):
        if lm_score is None:
            raise ConfigError(f"evaluate.select={mode}: the paths carry no LM score")
        values = lm_score[rows]
    elif mode == "oracle":
        if reward is None:
            raise ConfigError("evaluate.select=oracle: the paths carry no reward")
        values = reward[rows]
    else:
        raise ConfigError(f"evaluate.select: {mode!r} is not a selection; allowed: "
                          f"{', '.join(SELECT_MODES[1:])}")
    values = np.where(np.isnan(values), -np.inf, np.asarray(values, dtype=float))
    return int(rows[int(np.argmax(values))])  # argmax: the first of ties, rows are in path order


def attach_bank_columns(views: dict, root, split: str) -> dict:
    """Online: give every method's paths their reward and LM score from the bank. The paths
    that finish are the bank's own (each path has its own random stream), which is checked
    text by text. A finishing path whose text differs (vLLM recomputes a preempted request's
    cache, in other float roundings, so a sampled token can flip) gets NaN, as paths pruned
    online (their text is a prefix) do. Returns, per method, how many finishing paths differ."""
    ds = bank.load_bank(root, split)
    index = {(int(p), int(j)): i for i, (p, j) in enumerate(zip(ds["prompt_id"][:], ds["path_id"][:]))}
    texts, rewards = ds["text"][:], bank.rewards_of(ds).astype(float)  # as replay_paths
    scores = lm_scores(ds["token_logprob"][:])
    off = {}
    for name, (paths, decision) in views.items():
        ids = paths.prompt_ids[paths.group]
        rows = np.asarray([index[(int(p), int(j))] for p, j in zip(ids, paths.path_id)])
        # no_prune (no decision): every path finishes
        finishing = ~paths.alive | (True if decision is None else np.asarray(decision.kept, bool))
        differ = finishing & (np.asarray(texts)[rows] != paths.text)
        off[name] = int(differ.sum())
        if differ.any():
            i = int(np.nonzero(differ)[0][0])
            log.warning("%s: %d online paths differ from the bank's (the first: path %d of prompt "
                        "%d), so they carry no reward or LM score from it", name, off[name],
                        paths.path_id[i], ids[i])
        paths.reward = np.where(finishing & ~differ, rewards[rows], np.nan)
        paths.lm_score = np.where(finishing & ~differ, scores[rows], np.nan)
    return off
