"""The classic signal predictor on one tap: LayerNorm -> [Linear -> GELU -> Dropout] x depth
-> Linear(hidden, 1). With hidden=128, depth=1: 199,937 parameters at H=1536, 532,737 at
H=4096.

With `predictor.position_input` the head reads [LayerNorm(h), position_feature] (H + 1
inputs): the position is concatenated after the norm, so the norm does not wash it out."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.base import Predictor
from stopexp.signals.features import FeatureSpec, hidden_of, position_feature, tap_index


def mlp_head(in_dim: int, hidden: int, depth: int, dropout: float) -> nn.Sequential:
    """`depth` blocks Linear -> GELU -> Dropout, then Linear to one logit."""
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout)]
        in_dim = hidden
    return nn.Sequential(*layers, nn.Linear(in_dim, 1))


class MLPPredictor(Predictor):
    inputs = ("hidden",)

    def __init__(self, cfg, spec: FeatureSpec):
        super().__init__(spec)
        self.tap = tap_index(cfg.layer, spec)
        self.position_input = bool(getattr(cfg, "position_input", False))  # older checkpoints: off
        if self.position_input:
            self.inputs = ("hidden", "prefix_len")
        self.norm = nn.LayerNorm(spec.hidden_size)
        self.head = mlp_head(spec.hidden_size + self.position_input, cfg.hidden, cfg.depth, cfg.dropout)

    def forward(self, batch: dict) -> torch.Tensor:
        x = self.norm(hidden_of(batch, self.spec)[:, self.tap])
        if self.position_input:
            x = torch.cat([x, position_feature(batch)], dim=-1)
        return self.head(x).squeeze(-1)
