"""The interface every signal predictor implements."""
from __future__ import annotations

from torch import nn

from stopexp.signals.features import FeatureSpec


class Predictor(nn.Module):
    """forward(batch) -> (B,) raw logits; higher = the path is more likely to end correct.

    `inputs` names the batch keys the predictor reads, so callers can skip building the
    others (a predictor on signals only never needs the hidden states)."""
    inputs: tuple[str, ...] = ()

    def __init__(self, spec: FeatureSpec):
        super().__init__()
        self.spec = spec
