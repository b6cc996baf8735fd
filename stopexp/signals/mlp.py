"""The classic signal predictor on one tap: LayerNorm -> [Linear -> GELU -> Dropout] x depth
-> Linear(hidden, 1). With hidden=128, depth=1: 199,937 parameters at H=1536, 532,737 at
H=4096.

With `predictor.position_input` the head reads [LayerNorm(h), position_feature] (H + 1
inputs): the position is concatenated after the norm, so the norm does not wash it out."""
from __future__ import annotations

from torch import nn

from stopexp.signals.base import OnTappedLayer
from stopexp.signals.feature_spec import FeatureSpec


def mlp_head(in_dim: int, hidden: int, depth: int, dropout: float) -> nn.Sequential:
    """`depth` blocks Linear -> GELU -> Dropout, then Linear to one logit."""
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout)]
        in_dim = hidden
    return nn.Sequential(*layers, nn.Linear(in_dim, 1))


class MLPPredictor(OnTappedLayer):
    def __init__(self, predictor, spec: FeatureSpec):
        super().__init__(predictor, spec, affine_norm=True)
        self.head = mlp_head(self.in_dim, predictor.hidden, predictor.depth, predictor.dropout)
