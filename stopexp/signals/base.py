"""The interface every signal predictor implements."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.centring import centred
from stopexp.signals.feature_spec import FeatureSpec, hidden_of, position_feature, tap_index


class Predictor(nn.Module):
    """forward(batch) -> (B,) raw logits; higher = the path is more likely to end correct.

    `inputs` names the batch keys the predictor reads, so callers can skip building the
    others (a predictor on signals only never needs the hidden states).

    `centre_prompts`: whether it centres each hidden state on its prompt's live paths in
    the batch (stopexp.signals.centring), so that a row's score depends on its peers and
    a batch is split only between whole groups of them (`centring.peer_chunks`)."""
    inputs: tuple[str, ...] = ()
    centre_prompts: bool = False

    def __init__(self, spec: FeatureSpec):
        super().__init__()
        self.spec = spec


class OnTappedLayer(Predictor):
    """A head on one tapped layer's hidden state (`predictor.layer`), centred on its
    prompt's live paths where `predictor.centre_prompts` is set, layer-normalised, with
    the prefix length as one more input where `predictor.position_input` is set; a
    subclass makes `self.head` on `self.in_dim` inputs."""
    inputs = ("hidden",)

    def __init__(self, predictor, spec: FeatureSpec, affine_norm: bool):
        super().__init__(spec)
        self.tap = tap_index(predictor.layer, spec)
        self.position_input = bool(getattr(predictor, "position_input", False))  # a checkpoint without it: off
        self.centre_prompts = bool(getattr(predictor, "centre_prompts", False))
        if self.position_input:
            self.inputs = ("hidden", "prefix_len")
        self.norm = nn.LayerNorm(spec.hidden_size, elementwise_affine=affine_norm)
        self.in_dim = spec.hidden_size + self.position_input

    def forward(self, batch: dict) -> torch.Tensor:
        x = hidden_of(batch, self.spec)[:, self.tap]
        if self.centre_prompts:
            x = centred(x, batch)
        x = self.norm(x)
        if self.position_input:
            x = torch.cat([x, position_feature(batch)], dim=-1)
        return self.head(x).squeeze(-1)
