"""A request's vote, as evaluate votes a prompt's paths: each voter's answer read by the task
(`answer_of`), equivalent answers clustered (stopexp.metrics.answers.vote_clusters), the
winner elected by evaluate.vote (stopexp.core.voting.elect) or, for DeepConf online, by the
voters' confidence (stopexp.stopping.deepconf.weighted_vote). The chosen path is the first
voter (in path order) with the winning answer; with no answer among the voters (a prompt
that is no task question) it is the first voter."""
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
    """The vote of one request: the chosen path and its text, the winning answer (None: no
    voter had one), the voters, each voter's answer by path id, and the votes of each answer."""
    chosen: Running
    text: str
    winner: str | None
    rule: str
    voters: list = field(default_factory=list)
    answers: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)


def elect_path(voters: list[Running], weights: list[float], task, decode: Callable, rule: str,
               top: float = 0.5) -> Ballot:
    """The vote among `voters` (at least one), weighted by `weights` (their final signals
    under `rule`: majority | weighted | filtered, or deepconf_weighted)."""
    texts = [decode(p.tokens) for p in voters]
    answers = vote_clusters([task.answer_of(t) for t in texts], vote_format(task))
    signal = np.asarray(weights, np.float64)
    weighted = rule == "deepconf_weighted"
    winner = weighted_vote(np.asarray(answers, dtype=object), signal) if weighted else \
        elect([a or None for a in answers], signal, rule, top)
    counts: dict = {}  # votes per answer (DeepConf: their confidence; weighted / filtered: see the scores)
    for a, w in zip(answers, np.nan_to_num(signal, nan=0.0)):
        if a:
            counts[a] = counts.get(a, 0) + (float(w) if weighted else 1)
    pick = next((k for k, a in enumerate(answers) if winner is not None and a == winner), 0)
    return Ballot(voters[pick], texts[pick], winner, rule, voters,
                  {p.key[1]: a for p, a in zip(voters, answers)}, counts)
