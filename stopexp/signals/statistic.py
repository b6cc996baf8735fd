"""Non-learnable baseline: a statistic of one tap's hidden state (hidden-norm style).

It has no parameters, but is built, called and "trained" (just evaluated) like the
learned predictors so that every method shares one code path."""
from __future__ import annotations

import torch

from stopexp.signals.base import Predictor
from stopexp.signals.feature_spec import FeatureSpec, hidden_of, tap_index

STATISTICS = {
    "l2": lambda h: h.norm(dim=-1),
    "mean": lambda h: h.mean(dim=-1),
    "var": lambda h: h.var(dim=-1, correction=0),  # population variance over the H features
}


class StatisticPredictor(Predictor):
    inputs = ("hidden",)

    def __init__(self, predictor, spec: FeatureSpec):
        super().__init__(spec)
        if predictor.statistic not in STATISTICS:
            raise ValueError(f"predictor.statistic: {predictor.statistic!r} unknown; allowed: "
                             f"{', '.join(STATISTICS)}")
        self.statistic = predictor.statistic
        self.tap = tap_index(predictor.layer, spec)

    def forward(self, batch: dict) -> torch.Tensor:
        return STATISTICS[self.statistic](hidden_of(batch, self.spec)[:, self.tap])
