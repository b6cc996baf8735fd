"""Multi-layer fusion: every tapped layer gets its own LayerNorm -> Linear(H, hidden)
projection; the projections are concatenated and mixed by a small MLP to one logit.
Concatenation (not a weighted sum) lets the mixer combine layers non-additively.

With `predictor.centre_prompts` each tapped layer's state is first centred on its prompt's
live paths (stopexp.signals.centring). With `predictor.position_input` the position_feature
is concatenated to the projections (n_taps * hidden + 1 mixer inputs; the mixer's leading
GELU keeps the positive feature monotone)."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.base import Predictor
from stopexp.signals.centring import centred
from stopexp.signals.feature_spec import FeatureSpec, hidden_of, position_feature
from stopexp.signals.mlp import mlp_head


class FusionPredictor(Predictor):
    inputs = ("hidden",)

    def __init__(self, predictor, spec: FeatureSpec):
        super().__init__(spec)
        n_taps, size = len(spec.tap_layers), spec.hidden_size
        self.position_input = bool(getattr(predictor, "position_input", False))  # a checkpoint without it: off
        self.centre_prompts = bool(getattr(predictor, "centre_prompts", False))
        if self.position_input:
            self.inputs = ("hidden", "prefix_len")
        self.projections = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(size), nn.Linear(size, predictor.hidden)) for _ in range(n_taps))
        mixed = n_taps * predictor.hidden + self.position_input
        self.mixer = nn.Sequential(nn.GELU(), nn.Dropout(predictor.dropout),
                                   mlp_head(mixed, predictor.hidden, predictor.depth, predictor.dropout))

    def forward(self, batch: dict) -> torch.Tensor:
        hidden = hidden_of(batch, self.spec)
        if self.centre_prompts:  # every tapped layer on its prompt's live paths
            hidden = centred(hidden, batch)
        parts = [proj(hidden[:, i]) for i, proj in enumerate(self.projections)]
        if self.position_input:
            parts.append(position_feature(batch))
        return self.mixer(torch.cat(parts, dim=-1)).squeeze(-1)
