"""Adaptive-Consistency (Aggarwal et al., arXiv 2305.11860), Beta stopping criterion.

Branches are sampled one at a time. After each, with a the count of the leading answer
and b that of the runner-up (0 if none), the posterior probability that the leader is the
true majority of the two is P(x > 1/2) for x ~ Beta(a + 1, b + 1) (the paper's Beta
criterion with its uniform prior Beta(1, 1)); sampling stops once it reaches the threshold
(the paper's 0.95, also Parallel-Probe's ASC baseline). The paper caps the samples at 40;
here the cap is n, the branches drawn. The answer is the majority vote of
the sampled branches. For integer counts the Beta tail is a binomial sum,
P(x > 1/2) = P(Bin(a + b + 1, 1/2) <= a), so it is computed exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import ClassVar

import numpy as np

from stopexp.stopping.answers_bank import AnswersPrompt, Decision, vote_codes
from stopexp.stopping.method import StoppingMethod, within


@dataclass
class AdaptiveConsistency(StoppingMethod):
    """Adaptive-Consistency's settings: threshold, the posterior that the leader is the
    majority at which sampling stops (the paper's 0.95)."""
    threshold: float = 0.95
    name: ClassVar[str] = "adaptive_consistency"
    source: ClassVar[str] = "arXiv 2305.11860"

    def problems(self, n=None):
        return {"threshold": within(self.threshold, 0, 1, low_open=True)}

    def replay(self, r) -> dict:
        """One path at a time in path-id order (each its own wave)."""
        return r.outcome(*r.sequential(self.decide, 1))

    def decide(self, prompt, order):
        return adaptive_consistency(prompt, order, self.threshold)


def beta_majority_prob(a: int, b: int) -> float:
    """P(x > 1/2) for x ~ Beta(a + 1, b + 1): the leader (a votes) beats the runner-up (b)."""
    n = a + b + 1
    return sum(comb(n, i) for i in range(a + 1)) / 2 ** n


def adaptive_consistency(prompt: AnswersPrompt, order: np.ndarray,
                         threshold: float = AdaptiveConsistency.threshold) -> Decision:
    """Adaptive-Consistency on one prompt. order: (n,) branch indices in sampling order;
    threshold in (0, 1]. Branches without an answer count for no one."""
    if not 0 < threshold <= 1:
        raise ValueError(f"adaptive_consistency threshold must be in (0, 1], got {threshold}")
    order = np.asarray(order)
    finals = prompt.final[order]
    end = len(order)
    for i in range(1, len(order) + 1):
        valid = finals[:i][finals[:i] > 0]
        if not len(valid):
            continue
        top = np.sort(np.bincount(valid))[::-1]
        if beta_majority_prob(int(top[0]), int(top[1]) if len(top) > 1 else 0) >= threshold:
            end = i
            break
    spent = np.where(np.arange(len(order)) < end, prompt.tokens[order], 0)
    return Decision(answer=vote_codes(finals[:end]), spent=spent, launched=end)
