"""Answer-level accuracy of a set of (possibly pruned) paths per prompt."""
from __future__ import annotations

import numpy as np

from stopexp.metrics.answers import equivalent
from stopexp.metrics.answers import vote as majority_vote


def cons_at_n(answers_per_prompt, gold_per_prompt, fmt: str | None = None) -> float:
    """Fraction of prompts whose majority answer is the gold one (no answer is wrong). With
    an answer format `fmt`, equivalent answers vote as one and the winner matches the gold
    answer by `equivalent` (stopexp.metrics.answers); without, by equality."""
    hits = [(v := majority_vote(list(a), fmt)) is not None
            and (equivalent(v, g, fmt) if fmt else v == g)
            for a, g in zip(answers_per_prompt, gold_per_prompt, strict=True)]
    return float(np.mean(hits))


def avg_at_k(correct_kept_per_prompt) -> float:
    """Mean over prompts of the mean correctness of the kept paths. A prompt left with no
    path gives no answer, so it counts as 0."""
    return float(np.mean([np.mean(c) if len(c) else 0.0 for c in correct_kept_per_prompt]))


def pass_at_1(correct_per_prompt) -> float:
    """Chance that one sampled path is right: `avg_at_k` over all (unpruned) paths."""
    return avg_at_k(correct_per_prompt)


__all__ = ["majority_vote", "cons_at_n", "avg_at_k", "pass_at_1"]
