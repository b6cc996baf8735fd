"""Parallel-Probe (arXiv 2602.03845): probe every branch's intermediate answer every k
tokens, stop on a stable consensus and prune the branches that deviate from it.

All n branches run in parallel. At probe t (after t * probe_freq tokens) each branch that
is not pruned gives its current answer (its final one once it has ended). The leader is the
majority of these answers. Nothing is stopped during the first `warmup` probes (early
probes read answers that are mostly guesses). After them, when the same leader has held for
`stable` probes in a row (the warm-up probes count toward the streak), every branch still
running stops and the leader is the answer; and a running branch whose answer differs from
the leader for `deviate` probes in a row is pruned (a probe without a readable answer
neither counts nor resets). If every branch ends first, the vote
of the final answers of the branches not pruned decides. The published method's defaults
are not stated here; these are this project's.
"""
from __future__ import annotations

import math

import numpy as np

from stopexp.stopping.answers import AnswersPrompt, Decision, vote_codes

DEFAULTS = {"stable": 3, "deviate": 3, "warmup": 2}


def parallel_probe(prompt: AnswersPrompt, order: np.ndarray, stable: int = 3, deviate: int = 3,
                   warmup: int = 2) -> Decision:
    """Parallel-Probe on one prompt's branches `order` (n,), all launched at once.
    stable, deviate >= 1 and warmup >= 0 are counted in probes."""
    if stable < 1 or deviate < 1 or warmup < 0:
        raise ValueError(f"parallel_probe needs stable >= 1, deviate >= 1, warmup >= 0; got "
                         f"{stable}, {deviate}, {warmup}")
    order = np.asarray(order)
    tokens = prompt.tokens[order]
    n, freq = len(order), prompt.probe_freq
    pruned, spent = np.zeros(n, bool), tokens.copy()
    streak_of = np.zeros(n, np.int64)  # probes in a row each branch deviated
    leader = streak = 0
    for t in range(1, math.ceil(int(tokens.max(initial=0)) / freq) + 1):
        now = t * freq
        answer = prompt.answer_at(t)[order]
        running = ~pruned & (tokens > now)
        if not running.any():
            break
        lead = vote_codes(answer[~pruned])
        streak = streak + 1 if lead and lead == leader else int(lead > 0)
        leader = lead
        if t <= warmup:
            continue
        if streak >= stable:
            spent[running] = now
            return Decision(answer=lead, spent=spent, launched=n)
        if lead:
            off = running & (answer > 0) & (answer != lead)
            streak_of = np.where(off, streak_of + 1, np.where(running & (answer == lead), 0, streak_of))
            cut = off & (streak_of >= deviate)
            pruned |= cut
            spent[cut] = now
    return Decision(answer=vote_codes(prompt.final[order][~pruned]), spent=spent, launched=n)
