"""Early-Stopping Self-Consistency, ESC (Li et al., arXiv 2401.10480).

Branches are sampled in windows of w (a window runs in parallel, to its end); sampling
stops after the first window whose w final answers are one and the same (a window with a
branch without an answer is not unanimous); the answer is the majority vote over every
branch sampled so far. At most n = len(order) branches are sampled.

Default window 8: the ESC baseline at 64 branches in Parallel-Probe's evaluation
(zhengkid/Parallel-Probe evaluation/evaluation_main_table.py, `window_sizes = [8]`), whose
published rows stopexp reproduces; the ESC paper's own setting is w = 5 with at most
L = 40 samples (Yiwei98/ESC control_scheme.py: `sc_num = 5`, `max_up = 40`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from stopexp.core.limits import count
from stopexp.stopping.answers_bank import AnswersPrompt, Decision, vote_codes
from stopexp.stopping.method import StoppingMethod, at_least


@dataclass
class ESC(StoppingMethod):
    """ESC's settings: window, the branches sampled together (8, see the module doc)."""
    window: int = field(default=8, metadata=count(bound="n_paths"))
    name: ClassVar[str] = "esc"
    source: ClassVar[str] = "arXiv 2401.10480"

    def problems(self, n=None):
        return {"window": at_least(self.window, 1)}

    def replay(self, r) -> dict:
        """Windows of paths in path-id order; a window runs together (one wave)."""
        return r.outcome(*r.sequential(self.decide, self.window))

    def decide(self, prompt, order):
        return esc(prompt, order, self.window)


def esc(prompt: AnswersPrompt, order: np.ndarray, window: int = ESC.window) -> Decision:
    """ESC on one prompt. order: (n,) branch indices in sampling order; window: w >= 1.
    Returns the Decision (a sampled branch runs to its end: spent = its tokens)."""
    if window < 1:
        raise ValueError(f"esc window must be >= 1, got {window}")
    order = np.asarray(order)
    finals = prompt.final[order]
    end = len(order)
    for lo in range(0, len(order), window):
        w = finals[lo:lo + window]
        if w[0] > 0 and (w == w[0]).all():
            end = lo + len(w)
            break
    spent = np.where(np.arange(len(order)) < end, prompt.tokens[order], 0)
    return Decision(answer=vote_codes(finals[:end]), spent=spent, launched=end)
