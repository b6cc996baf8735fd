"""A stopping method from outside the package, as docs/development.md's recipe writes one
(tests/test_stopping_registry.py registers and runs it)."""
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from stopexp.stopping.answers_bank import Decision, vote_codes
from stopexp.stopping.method import StoppingMethod, at_least


@dataclass
class FirstK(StoppingMethod):
    """Run the first k paths together and vote."""
    k: int = 2
    name: ClassVar[str] = "first_k"
    source: ClassVar[str] = "docs/development.md"

    def problems(self, n=None):
        return {"k": at_least(self.k, 1)}

    def decide(self, prompt, order):
        order = np.asarray(order)
        launched = min(self.k, len(order))
        spent = np.where(np.arange(len(order)) < launched, prompt.tokens[order], 0)
        return Decision(vote_codes(prompt.final[order][:launched]), spent, launched)

    def replay(self, r):
        return r.outcome(*r.sequential(self.decide, self.k))
