"""Linear probe on one tap.

Inputs are standardised per sample by a LayerNorm without affine parameters rather than
by a running mean/std fitted on the training set: nothing has to be fitted before
training, and a checkpoint carries no statistics of the data it was trained on.

With `predictor.position_input` the probe reads [LayerNorm(h), position_feature] (H + 1
inputs: one more weight, for the log-scaled position)."""
from __future__ import annotations

from torch import nn

from stopexp.signals.base import OnTappedLayer
from stopexp.signals.feature_spec import FeatureSpec


class LinearPredictor(OnTappedLayer):
    def __init__(self, predictor, spec: FeatureSpec):
        super().__init__(predictor, spec, affine_norm=False)
        self.head = nn.Linear(self.in_dim, 1)
        # zero weights (as in logistic regression): the untrained probe ties every path, so
        # the ranking it ends with comes from the loss, not from a random initial direction
        nn.init.zeros_(self.head.weight)
