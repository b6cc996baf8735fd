"""A combined stopping controller: answer consensus (an Adaptive-Consistency posterior over
the answers seen so far) and each running path's own signal, decided per prompt as the
paths progress.

A prompt's n paths (in sampling order) run in waves: the first `first` together, then
`wave` more at a time, a wave launching only when the one before has no path running and
the evidence is still thin (the leader not yet certain). Each path is read at steps
j = 0, 1, ... of its own progress (`Timeline.marks`: after marks[j] of its tokens; on an
answers-only bank every probe, on a trace bank every check of search.check_at); after its
last step a path runs to its end. At every step:
- the evidence is the final answer of every finished path, and the current answer of every
  running path whose signal reaches `settle` (an answers-only path's answer counts once it
  has held `settle` probes in a row; a trace bank's running path has no answer yet);
- with a the evidence for the leader and b for the runner-up, the posterior that the leader
  is the majority is P(x > 1/2), x ~ Beta(a + 1, b + 1) (Adaptive-Consistency's Beta
  criterion, `beta_majority_prob`); once it reaches `threshold` every running path stops
  there and the leader is the answer;
- else, once it reaches `prune_confidence`, a running path whose signal is below
  `prune_below` and whose current answer is not the leader's (no answer yet included) is
  pruned there and leaves the evidence.
When every path is used and none runs, the leader of the evidence (the finished paths'
vote) is the answer. Ties go to the answer seen first in sampling order. A path stopped at
step j has spent min(marks[j], its tokens); one that ended, its tokens; one never launched,
nothing.

Signals: on an answers-only bank (no hidden state) the signal of a running path is the
stability of its own intermediate answer, the probes in a row it has been the same readable
answer (0 when unreadable: `answers_timeline`); on a trace bank it is a scorer's score at
the check (evaluate.stopping.combined.signal: the probe, the confidence or any registered
scorer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from stopexp.core.limits import count
from stopexp.stopping.adaptive_consistency import beta_majority_prob
from stopexp.stopping.answers_bank import AnswersPrompt, Decision, vote_codes
from stopexp.stopping.method import StoppingMethod

KNOBS = ("first", "wave", "threshold", "settle", "prune_below", "prune_confidence")


def knob_error(name: str, value) -> str | None:
    """Why `value` is out of range for knob `name` (None when it is fine): first and wave
    integers >= 1, threshold and prune_confidence in (0, 1], settle and prune_below any
    number (they are in the signal's units)."""
    if name in ("first", "wave"):
        whole = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        return None if whole and value >= 1 else f"must be an integer >= 1, got {value!r}"
    if value != value:
        return "must be a number, got nan"
    if name in ("threshold", "prune_confidence") and not 0 < value <= 1:
        return f"must be in (0, 1], got {value}"
    return None


@dataclass
class Combined(StoppingMethod):
    """The controller's settings (the module doc). The defaults are the setting that
    scripts/tune_combined.py chose on Parallel-Probe's AIME24 bank (the fewest tokens at
    SC@64's accuracy; AIME25 and HMMT25, the reported banks, are never tuned on), where
    settle and prune_below count probes of a stable answer (500 tokens each). On a trace
    bank the signal is `signal`'s score (an evaluate method; `learned`: the configured
    predictor), so prune_below is in its units (a probe's logit) and is worth setting
    there; settle is read on answers-only banks only (a running trace-bank path has no
    answer to settle)."""
    signal: str = "learned"
    first: int = field(default=4, metadata=count(bound="n_paths"))
    wave: int = field(default=2, metadata=count(bound="n_paths"))
    threshold: float = 0.95
    settle: float = 40.0
    prune_below: float = 8.0
    prune_confidence: float = 0.75
    name: ClassVar[str] = "combined"
    source: ClassVar[str] = "this project (stopexp.stopping.combined; tuned by scripts/tune_combined.py)"
    traces_only: ClassVar[tuple[str, ...]] = ("signal",)
    answers_only: ClassVar[tuple[str, ...]] = ("settle",)

    def knobs(self) -> dict:
        return {k: getattr(self, k) for k in KNOBS}

    def problems(self, n=None):
        return {k: knob_error(k, v) for k, v in self.knobs().items()}

    def replay(self, r) -> dict:
        """Every prompt's first n paths in waves, reading `signal`'s score at every check."""
        n_rows = len(r.paths.length)
        spent, voter = np.zeros(n_rows, np.int64), np.zeros(n_rows, bool)
        wave = np.zeros(n_rows, np.int64)
        for rows in r.prompt_rows():
            c = combined(r.timeline(rows), **self.knobs())
            spent[rows], voter[rows], wave[rows] = c.spent, c.voter, c.wave
        return r.outcome(spent, voter, wave)

    def decide(self, prompt, order):
        """On an answers-only prompt the signal is each branch's answer stability."""
        return combined_answers(prompt, order, **self.knobs())


@dataclass
class Timeline:
    """One prompt's n paths in sampling order, as the controller reads them.

    final: (n,) answer codes (0 = none); tokens: (n,) their lengths; marks: (T,) the tokens
    of a path's steps, increasing; end: (n,) the step at which each path has ended (T: after
    the last, it runs to its end); answers: (n, T) each path's answer code at each step (its
    final one from its end on, 0 = none yet); signal: (n, T) each path's signal there
    (higher = keep)."""
    final: np.ndarray
    tokens: np.ndarray
    marks: np.ndarray
    end: np.ndarray
    answers: np.ndarray
    signal: np.ndarray


@dataclass
class Run:
    """What the controller did: answer, spent (n,) tokens, voter (n,) bool (the paths that
    ended and vote with their final answer), launched (the first `launched` paths), wave
    (n,) the wave of each path."""
    answer: int
    spent: np.ndarray
    voter: np.ndarray
    launched: int
    wave: np.ndarray


def waves_of(n: int, first: int, wave: int) -> np.ndarray:
    """(n,) the wave of each path in sampling order: the first `first` in wave 0, then
    `wave` per wave."""
    k = np.arange(n)
    return np.where(k < first, 0, 1 + (k - first) // wave)


def stability(answers: np.ndarray) -> np.ndarray:
    """(n, T) the steps in a row each path's answer has been the same readable code, up to
    and including step j (0 where it is unreadable)."""
    out = np.zeros(answers.shape, np.int64)
    for j in range(answers.shape[1]):
        same = (answers[:, j] > 0) & (answers[:, j] == answers[:, j - 1]) if j else answers[:, 0] > 0
        out[:, j] = np.where(answers[:, j] > 0, np.where(same & (j > 0), out[:, j - 1] + 1, 1), 0)
    return out


def answers_timeline(prompt: AnswersPrompt, order: np.ndarray) -> Timeline:
    """The branches `order` of an answers-only prompt: a step per probe (t * probe_freq
    tokens, t = 1 .. the last branch's end probe), the answer of `AnswersPrompt.answer_at`,
    the signal the stability of that answer (`stability`)."""
    order = np.asarray(order)
    end = prompt.end_probe[order]
    T = int(end.max(initial=1))
    answers = np.stack([prompt.answer_at(t)[order] for t in range(1, T + 1)], axis=1)
    return Timeline(final=prompt.final[order], tokens=prompt.tokens[order],
                    marks=prompt.probe_freq * np.arange(1, T + 1), end=end - 1,
                    answers=answers, signal=stability(answers).astype(float))


def leader_and_posterior(evidence: np.ndarray) -> tuple[int, float]:
    """The leading answer code of `evidence` ((n,) codes in sampling order, 0 = no
    evidence) and the Beta posterior that it is the majority against the runner-up (0.0
    with no evidence)."""
    lead = vote_codes(evidence)
    if not lead:
        return 0, 0.0
    counts = np.bincount(evidence[evidence > 0])
    a = int(counts[lead])
    counts[lead] = 0
    return lead, beta_majority_prob(a, int(counts.max(initial=0)))


def combined(tl: Timeline, first: int = Combined.first, wave: int = Combined.wave,
             threshold: float = Combined.threshold, settle: float = Combined.settle,
             prune_below: float = Combined.prune_below,
             prune_confidence: float = Combined.prune_confidence) -> Run:
    """The controller of the module docstring on one prompt's Timeline."""
    for name, value in (("first", first), ("wave", wave), ("threshold", threshold),
                        ("prune_confidence", prune_confidence)):
        why = knob_error(name, value)
        if why:
            raise ValueError(f"combined {name}: {why}")
    n, T = len(tl.final), len(tl.marks)
    waves = waves_of(n, first, wave)
    spent = np.zeros(n, np.int64)
    done = np.zeros(n, bool)  # ended: votes with its final answer
    launched = np.zeros(n, bool)
    lead = 0
    for w in range(int(waves.max(initial=-1)) + 1):
        running = waves == w
        launched |= running
        for j in range(T + 1):
            ended = running & (tl.end <= j) if j < T else running
            done |= ended
            spent[ended] = tl.tokens[ended]
            running &= ~ended
            if j < T:
                settled = running & (tl.signal[:, j] >= settle) & (tl.answers[:, j] > 0)
                now = np.where(settled, tl.answers[:, j], 0)
            else:
                now = np.zeros(n, np.int64)
            lead, post = leader_and_posterior(np.where(done, tl.final, now))
            if post >= threshold:
                if j < T:
                    spent[running] = np.minimum(tl.marks[j], tl.tokens[running])
                return Run(lead, spent, done, int(launched.sum()), waves)
            if not running.any():
                break
            if post >= prune_confidence:
                cut = running & (tl.answers[:, j] != lead) & (tl.signal[:, j] < prune_below)
                spent[cut] = np.minimum(tl.marks[j], tl.tokens[cut])
                running &= ~cut
                if not running.any():
                    break
    return Run(vote_codes(np.where(done, tl.final, 0)), spent, done, int(launched.sum()), waves)


def combined_answers(prompt: AnswersPrompt, order: np.ndarray, **knobs) -> Decision:
    """The controller on an answers-only prompt's branches `order` (the stability signal)."""
    r = combined(answers_timeline(prompt, order), **knobs)
    return Decision(answer=r.answer, spent=r.spent, launched=r.launched)
