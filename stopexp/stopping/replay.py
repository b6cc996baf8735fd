"""Evaluate's methods that follow their own stopping protocol instead of one check of a
score: each decides, per prompt, how many tokens every path spends and which paths vote.
Each is a registered stopping method (stopexp.core.names REGISTRY["stopping"], a
`stopexp.stopping.method.StoppingMethod` with its settings, evaluate.stopping.<name>) whose
`replay` reads the `Replay` of this module:

- esc (arXiv 2401.10480) and adaptive_consistency (arXiv 2305.11860): sample the N paths
  of a prompt in path-id order (every path has its own random stream, so the order is a
  random draw) and stop sampling on consensus; ESC runs each window of paths together,
  Adaptive-Consistency one path at a time;
- deepconf_online: DeepConf's early termination from the stored per-token confidences,
  confidence-weighted vote (the warm-up paths run first, then the others together);
  deepconf_weighted and deepconf_top: DeepConf's offline votes over all N finished paths;
- combined: the controller of `stopexp.stopping.combined`, in waves, reading the finished
  paths' answers and each running path's score at every check (its `signal`).
All are replayed from the trace bank (exact, and the same in evaluate.mode=online).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from stopexp.core.names import lookup, names
from stopexp.search.memory import schedule_peaks
from stopexp.stopping import deepconf as dc
from stopexp.stopping.answers_bank import AnswersPrompt
from stopexp.stopping.combined import Timeline
from stopexp.metrics.answers import vote_clusters

__all__ = ["stopping_outcomes", "spent_outcome", "trace_methods"]


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
    winners = np.full(G, None, dtype=object)
    for g in range(G):
        rows = np.nonzero((paths.group == g) & voter)[0]
        answers = np.asarray(vote_clusters(paths.answer[rows], paths.answer_format), dtype=object)
        winners[g] = winner = dc.weighted_vote(answers, weight[rows])
        hit = rows[answers == winner] if winner is not None else rows[:0]
        correct[g] = bool(len(hit)) and bool(paths.correct[hit[0]])
        chosen[g] = paths.text[hit[0]] if len(hit) else (paths.text[rows[0]] if len(rows) else "")
        avg[g] = paths.correct[rows].mean() if len(rows) else 0.0
    seq = np.zeros(G)
    np.maximum.at(seq, paths.group, spent)
    steps = np.arange(1, int(paths.length.max()) + 1)
    stopped = use & (spent > 0) & (spent < paths.length)
    return {"correct": correct, "chosen": chosen, "winner": winners, "avg": avg,
            "no_path_left": np.bincount(paths.group[voter], minlength=G) == 0,  # every path stopped
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


@dataclass
class Replay:
    """What a stopping method replays on: the bank's `paths`, `confs[i]` the per-token
    confidences of row i, the first `n` paths of each prompt, `group_window`
    (search.group_window), and for combined `marks`, the checks (tokens), and `signal[j]`,
    its signal's score of every row at check j; for STEP `steps` and `budget`."""
    paths: Any
    confs: list
    n: int
    group_window: int
    marks: list[int] | None = None
    signal: list[np.ndarray] | None = None
    steps: list | None = None    # STEP: per row its (position, step probability) at step boundaries
    budget: Any = None           # STEP: engine.kv_budget (stopexp.stopping.step.KVBudget)

    @functools.cached_property
    def lowest(self) -> np.ndarray:
        """Each path's lowest group confidence (DeepConf's path confidence)."""
        return np.asarray([dc.lowest_group_conf(c, self.group_window) for c in self.confs])

    def prompt_rows(self):
        """The rows of each prompt's first n paths, in path-id (sampling) order."""
        paths = self.paths
        for g in range(int(paths.group.max()) + 1):
            rows = np.nonzero((paths.group == g) & (paths.path_id < self.n))[0]
            yield rows[np.argsort(paths.path_id[rows], kind="stable")]

    def sequential(self, decide, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(spent, voter, wave) of a method that samples a prompt's paths in path-id order,
        `window` at a time (the wave of the k-th path is k // window); decide(answers-only
        prompt, order) -> Decision."""
        size = len(self.paths.length)
        spent, voter, wave = np.zeros(size, np.int64), np.zeros(size, bool), np.zeros(size, np.int64)
        for rows in self.prompt_rows():
            d = decide(_answers_prompt(self.paths, rows), np.arange(len(rows)))
            spent[rows] = d.spent
            voter[rows] = np.arange(len(rows)) < d.launched
            wave[rows] = np.arange(len(rows)) // window
        return spent, voter, wave

    def timeline(self, rows: np.ndarray) -> Timeline:
        """The rows of one prompt at the checks, as the combined controller reads them."""
        return trace_timeline(self.paths, rows, np.asarray(self.marks, np.int64), self.signal)

    def outcome(self, spent, voter, wave=None, weight=None) -> dict:
        """`spent_outcome` of a decision per path; every voter weighs 1 unless `weight`."""
        weight = np.ones(len(self.paths.length)) if weight is None else weight
        return spent_outcome(self.paths, spent, voter, weight, self.n, wave)


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


def trace_methods(names_: list[str], settings: Any = None) -> dict:
    """name -> the stopping method, with its settings from `settings[name]` (evaluate.stopping;
    missing: its defaults), for each name of `names_` that is a registered stopping method
    running on a trace bank."""
    settings = settings or {}
    out = {}
    for name in names_:
        if name in names("stopping") and "traces" in (cls := lookup("stopping", name)).banks:
            out[name] = cls.of(settings[name] if name in settings else None)
    return out


def stopping_outcomes(paths, confs: list, names_: list[str], n: int, settings: Any,
                      group_window: int, marks: list[int] | None = None,
                      signal: list[np.ndarray] | None = None, steps: list | None = None,
                      budget: Any = None) -> dict:
    """name -> outcome dict for the stopping methods among `names_` (`trace_methods`, with
    `settings`), each replayed on the `Replay` of the other arguments."""
    replay = Replay(paths, confs, n, group_window, marks, signal, steps, budget)
    return {name: method.replay(replay) for name, method in trace_methods(names_, settings).items()}
