"""A request's vote, as evaluate votes a prompt's paths: each voter's answer read by the task
(`answer_of`) from its text before any stop string, equivalent answers clustered
(stopexp.metrics.answers.vote_clusters), the winner elected by evaluate.vote
(stopexp.core.voting.elect) or, for DeepConf online, by the voters' confidence
(stopexp.stopping.deepconf.weighted_vote). Where no voter has an answer the task can read
(open-ended text, or a stop string that cut the answer off) each voter's text is its answer.

The choices (`n`) are the best distinct answers: the vote's winner, then the winner of the
vote among the voters left, and so on, each answered by its first voter in path order; with
fewer distinct answers than choices, the other voters follow in the same order."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from stopexp.core.voting import elect
from stopexp.metrics.answers import vote_clusters
from stopexp.search.stepping import Running
from stopexp.stopping.deepconf import weighted_vote
from stopexp.tasks import vote_format


@dataclass
class Ballot:
    """The vote of one request: the choices' paths (the vote's first) and their texts, the
    winning answer (None: no voter had one), the voters, each voter's answer by path id, and
    the votes of each answer."""
    picks: list[Running]
    texts: list[str]
    winner: str | None
    rule: str
    voters: list = field(default_factory=list)
    answers: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    @property
    def chosen(self) -> Running:
        return self.picks[0]


def elect_path(voters: list[Running], weights: list[float], task, text_of: Callable, rule: str,
               top: float = 0.5, choices: int = 1) -> Ballot:
    """The vote among `voters` (at least one), weighted by `weights` (their final signals
    under `rule`: majority | weighted | filtered, or deepconf_weighted), and its `choices`
    best paths; `text_of(path)`: the path's text before any stop string."""
    texts = [text_of(p) for p in voters]
    answers = vote_clusters([task.answer_of(t) for t in texts], vote_format(task))
    if not any(answers):
        answers = [t.strip() for t in texts]
    signal = np.asarray(weights, np.float64)
    weighted = rule == "deepconf_weighted"
    ranked = ranking(answers, signal, rule, top, choices)
    counts: dict = {}  # votes per answer (DeepConf: their confidence; weighted / filtered: see the scores)
    for a, w in zip(answers, np.nan_to_num(signal, nan=0.0)):
        if a:
            counts[a] = counts.get(a, 0) + (float(w) if weighted else 1)
    rank = {a: r for r, a in enumerate(ranked)}
    order = sorted(range(len(voters)), key=lambda k: rank.get(answers[k], len(rank)))  # stable: path order
    firsts = [next(k for k in order if answers[k] == a) for a in ranked]
    picks = (firsts + [k for k in order if k not in firsts])[:choices]
    return Ballot([voters[k] for k in picks], [texts[k] for k in picks], ranked[0] if ranked else None,
                  rule, voters, {p.key[1]: a for p, a in zip(voters, answers)}, counts)


def ranking(answers: list, signal: np.ndarray, rule: str, top: float, most: int) -> list:
    """Up to `most` distinct answers, best first: each the winner of the vote among the
    voters whose answer is not ranked yet."""
    ranked: list = []
    left = np.ones(len(answers), dtype=bool)
    while len(ranked) < most and any(a for a, on in zip(answers, left) if on):
        idx = np.nonzero(left)[0]
        sub = [answers[k] for k in idx]
        winner = weighted_vote(np.asarray(sub, dtype=object), signal[idx]) \
            if rule == "deepconf_weighted" else elect([a or None for a in sub], signal[idx], rule, top)
        if winner is None:
            break
        ranked.append(winner)
        left &= np.array([a != winner for a in answers])
    return ranked
