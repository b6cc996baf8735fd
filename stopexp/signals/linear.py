"""Linear probe on one tap.

Inputs are standardised per sample by a LayerNorm without affine parameters rather than
by a running mean/std fitted on the training set: nothing has to be fitted before
training, and a checkpoint carries no statistics of the data it was trained on.

With `predictor.position_input` the probe reads [LayerNorm(h), position_feature] (H + 1
inputs: one more weight, for the log-scaled position)."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.base import Predictor
from stopexp.signals.features import FeatureSpec, hidden_of, position_feature, tap_index


class LinearPredictor(Predictor):
    inputs = ("hidden",)

    def __init__(self, cfg, spec: FeatureSpec):
        super().__init__(spec)
        self.tap = tap_index(cfg.layer, spec)
        self.position_input = bool(getattr(cfg, "position_input", False))  # older checkpoints: off
        if self.position_input:
            self.inputs = ("hidden", "prefix_len")
        self.norm = nn.LayerNorm(spec.hidden_size, elementwise_affine=False)
        self.head = nn.Linear(spec.hidden_size + self.position_input, 1)
        # zero weights (as in logistic regression): the untrained probe ties every path, so
        # the ranking it ends with comes from the loss, not from a random initial direction
        nn.init.zeros_(self.head.weight)

    def forward(self, batch: dict) -> torch.Tensor:
        x = self.norm(hidden_of(batch, self.spec)[:, self.tap])
        if self.position_input:
            x = torch.cat([x, position_feature(batch)], dim=-1)
        return self.head(x).squeeze(-1)
