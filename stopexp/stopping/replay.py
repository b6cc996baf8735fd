"""Evaluate's methods that follow their own stopping protocol instead of one check of a
score: each decides, per prompt, how many tokens every path spends and which paths vote.

- esc (arXiv 2401.10480) and adaptive_consistency (arXiv 2305.11860): sample the N paths
  of a prompt in path-id order (every path has its own random stream, so the order is a
  random draw) and stop sampling on consensus (`stopexp.stopping.esc`,
  `stopexp.stopping.adaptive_consistency`); ESC runs each window of paths together,
  Adaptive-Consistency one path at a time;
- deepconf_online: DeepConf's early termination from the stored per-token confidences,
  confidence-weighted vote (the warm-up paths run first, then the others together);
  deepconf_weighted and deepconf_top: DeepConf's offline votes over all N finished paths
  (`stopexp.stopping.deepconf`);
- combined: the controller of `stopexp.stopping.combined`, in waves, reading the finished
  paths' answers and each running path's score at every check (evaluate.combined_signal).
All are replayed from the trace bank (exact, and the same in evaluate.mode=online).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from stopexp.core.names import STOPPING_METHODS
from stopexp.core.protocol import warmup_paths
from stopexp.search.memory import schedule_peaks
from stopexp.stopping import deepconf as dc
from stopexp.stopping.adaptive_consistency import adaptive_consistency
from stopexp.stopping.answers import AnswersPrompt
from stopexp.stopping.combined import Timeline, combined
from stopexp.stopping.esc import esc
from stopexp.metrics.answers import vote_clusters

__all__ = ["STOPPING_METHODS", "stopping_outcomes", "spent_outcome"]


def spent_outcome(paths, spent: np.ndarray, voter: np.ndarray, weight: np.ndarray, n: int,
                  wave: np.ndarray | None = None) -> dict:
    """The outcome dict of `stopexp.evaluation.accounting.outcome` for a decision given per path (rows of
    `paths`): tokens spent, whether it votes, and its vote weight; only the first n paths
    of each prompt count. A path stopped before its end counts as pruned at `spent`.
    `wave` (per path; None: all at once) says which paths run together, for the KV-memory
    estimate ("kv_peaks", stopexp.search.memory; only when `paths` knows its prompt lengths)."""
    use = paths.path_id < n
    spent, voter = np.where(use, spent, 0), voter & use
    G = int(paths.group.max()) + 1
    correct, avg = np.zeros(G, bool), np.zeros(G)
    chosen = np.full(G, "", dtype=object)
    for g in range(G):
        rows = np.nonzero((paths.group == g) & voter)[0]
        answers = np.asarray(vote_clusters(paths.answer[rows], paths.answer_format), dtype=object)
        winner = dc.weighted_vote(answers, weight[rows])
        hit = rows[answers == winner] if winner is not None else rows[:0]
        correct[g] = bool(len(hit)) and bool(paths.correct[hit[0]])
        chosen[g] = paths.text[hit[0]] if len(hit) else (paths.text[rows[0]] if len(rows) else "")
        avg[g] = paths.correct[rows].mean() if len(rows) else 0.0
    seq = np.zeros(G)
    np.maximum.at(seq, paths.group, spent)
    steps = np.arange(1, int(paths.length.max()) + 1)
    stopped = use & (spent > 0) & (spent < paths.length)
    return {"correct": correct, "chosen": chosen, "avg": avg,
            "tokens": np.bincount(paths.group, weights=spent, minlength=G), "seq_tokens": seq,
            "survival": ((spent[use][:, None] >= steps[None, :]).mean(0)).tolist(),
            "pruned_at": spent[stopped], "alive_at_check": float((spent[use] > 0).mean()),
            "stopped": stopped, "voter": voter, "spent": spent,
            "kv_peaks": kv_peaks(paths, spent, wave)}


def kv_peaks(paths, spent: np.ndarray, wave: np.ndarray | None = None) -> np.ndarray | None:
    """Per prompt, the peak of cached tokens under the schedule (stopexp.search.memory), or None
    when `paths` has no prompt lengths (a view of an online run)."""
    if getattr(paths, "prompt_len", None) is None:
        return None
    return schedule_peaks(paths.group, paths.prompt_len, paths.length, spent, wave)


def _answers_prompt(paths, rows: np.ndarray) -> AnswersPrompt:
    """The rows of one prompt as an answers-only prompt (final answers and lengths; one code
    per cluster of equivalent answers)."""
    clustered = vote_clusters(paths.answer[rows], paths.answer_format)
    answers = ["", *dict.fromkeys(a for a in clustered if a)]
    code = {a: i for i, a in enumerate(answers)}
    final = np.asarray([code[a or ""] for a in clustered], np.int64)
    right = [bool(paths.correct[rows][final == c].any()) if c else False for c in range(len(answers))]
    return AnswersPrompt(question="", gold="", probe_freq=1, answers=answers, final=final,
                         tokens=np.asarray(paths.length[rows], np.int64),
                         probes=np.zeros((len(rows), 0), np.int64), correct=np.asarray(right))


def _prompt_rows(paths, n: int):
    """The rows of each prompt's first n paths, in path-id (sampling) order."""
    for g in range(int(paths.group.max()) + 1):
        rows = np.nonzero((paths.group == g) & (paths.path_id < n))[0]
        yield rows[np.argsort(paths.path_id[rows], kind="stable")]


def _sequential(paths, n: int, method, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(spent, voter, wave) of a method that samples a prompt's paths in path-id order,
    `window` at a time (the wave of the k-th path is k // window)."""
    spent, voter = np.zeros(len(paths.length), np.int64), np.zeros(len(paths.length), bool)
    wave = np.zeros(len(paths.length), np.int64)
    for rows in _prompt_rows(paths, n):
        d = method(_answers_prompt(paths, rows), np.arange(len(rows)))
        spent[rows] = d.spent
        voter[rows] = np.arange(len(rows)) < d.launched
        wave[rows] = np.arange(len(rows)) // window
    return spent, voter, wave


def trace_timeline(paths, rows: np.ndarray, marks: np.ndarray, signal: list[np.ndarray]) -> Timeline:
    """The rows of one prompt (in sampling order) as the combined controller reads them: a
    step per check (`marks`, tokens), no answer before a path ends, `signal[j]` the score of
    every row of `paths` at check j."""
    length = np.asarray(paths.length[rows], np.int64)
    end = np.searchsorted(marks, length, side="left")  # the first check at or past its end
    final = _answers_prompt(paths, rows).final
    steps = np.arange(len(marks))
    return Timeline(final=final, tokens=length, marks=marks, end=end,
                    answers=np.where(steps[None, :] >= end[:, None], final[:, None], 0),
                    signal=np.stack([np.asarray(s, float)[rows] for s in signal], axis=1))


def combined_knobs(ev) -> dict:
    """The controller's knobs from the evaluate config section (evaluate.combined_*)."""
    knobs = {k: getattr(ev, f"combined_{k}") for k in ("first", "wave", "threshold", "prune_below",
                                                      "prune_confidence")}
    return knobs | {"settle": 0}  # a running trace-bank path has no answer to settle


@dataclass
class Replay:
    """What a stopping rule is replayed on: the bank's `paths`, `confs[i]` the per-token
    confidences of row i, the first `n` paths of each prompt, `ev` the evaluate section
    (esc_window, asc_threshold, deepconf_warmup, deepconf_keep_percent, combined_*),
    `group_window` (search.group_window), and for combined `marks`, the checks (tokens),
    and `signal[j]`, evaluate.combined_signal's score of every row at check j."""
    paths: Any
    confs: list
    n: int
    ev: Any
    group_window: int
    marks: list[int] | None = None
    signal: list[np.ndarray] | None = None

    @functools.cached_property
    def lowest(self) -> np.ndarray:
        """Each path's lowest group confidence (DeepConf's path confidence)."""
        return np.asarray([dc.lowest_group_conf(c, self.group_window) for c in self.confs])

    def outcome(self, spent, voter, wave=None, weight=None) -> dict:
        """`spent_outcome` of a decision per path; every voter weighs 1 unless `weight`."""
        weight = np.ones(len(self.paths.length)) if weight is None else weight
        return spent_outcome(self.paths, spent, voter, weight, self.n, wave)


def _esc(r: Replay) -> dict:
    window = r.ev.esc_window
    return r.outcome(*_sequential(r.paths, r.n, lambda q, o: esc(q, o, window), window))


def _adaptive_consistency(r: Replay) -> dict:
    threshold = r.ev.asc_threshold
    return r.outcome(*_sequential(r.paths, r.n, lambda q, o: adaptive_consistency(q, o, threshold), 1))


def _combined(r: Replay) -> dict:
    """The combined controller on every prompt's first n paths, in waves."""
    paths, knobs, marks = r.paths, combined_knobs(r.ev), np.asarray(r.marks, np.int64)
    spent, voter = np.zeros(len(paths.length), np.int64), np.zeros(len(paths.length), bool)
    wave = np.zeros(len(paths.length), np.int64)
    for rows in _prompt_rows(paths, r.n):
        c = combined(trace_timeline(paths, rows, marks, r.signal), **knobs)
        spent[rows], voter[rows], wave[rows] = c.spent, c.voter, c.wave
    return r.outcome(spent, voter, wave)


def _deepconf_weighted(r: Replay) -> dict:
    """Every path finishes and votes, weighted by its confidence."""
    return r.outcome(r.paths.length, np.ones(len(r.paths.length), bool), weight=r.lowest)


def _deepconf_top(r: Replay) -> dict:
    """Every path finishes; the most confident share of each prompt's votes, weighted."""
    voter = np.zeros(len(r.paths.length), bool)
    for rows in _prompt_rows(r.paths, r.n):
        voter[rows] = dc.top_share(r.lowest[rows], r.ev.deepconf_keep_percent)
    return r.outcome(np.asarray(r.paths.length).copy(), voter, np.zeros(len(voter), np.int64),
                     r.lowest)


def _deepconf_online(r: Replay) -> dict:
    """DeepConf online: the warm-up paths run first and set the stopping bar, then the rest."""
    spent, voter = np.asarray(r.paths.length).copy(), np.zeros(len(r.paths.length), bool)
    wave = np.zeros(len(voter), np.int64)
    warm = warmup_paths(r.ev.deepconf_warmup, r.n)
    for rows in _prompt_rows(r.paths, r.n):
        spent[rows], voter[rows], _, _ = dc.online([r.confs[i] for i in rows], warm,
                                                   r.ev.deepconf_keep_percent, r.group_window)
        wave[rows] = np.arange(len(rows)) >= warm
    return r.outcome(spent, voter, wave, r.lowest)


# each of STOPPING_METHODS (stopexp.core.names) replayed on a bank: a new rule is one entry
REPLAYS = {"esc": _esc, "adaptive_consistency": _adaptive_consistency, "combined": _combined,
           "deepconf_weighted": _deepconf_weighted, "deepconf_top": _deepconf_top,
           "deepconf_online": _deepconf_online}


def stopping_outcomes(paths, confs: list, names: list[str], n: int, ev, group_window: int,
                      marks: list[int] | None = None, signal: list[np.ndarray] | None = None) -> dict:
    """name -> outcome dict for the names of STOPPING_METHODS among `names`, each replayed
    by its entry of REPLAYS on the `Replay` of the other arguments."""
    replay = Replay(paths, confs, n, ev, group_window, marks, signal)
    return {name: REPLAYS[name](replay) for name in names if name in REPLAYS}
