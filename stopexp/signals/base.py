"""The interface every signal predictor implements."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.centring import centred
from stopexp.signals.feature_spec import FeatureSpec, hidden_of, position_feature, tap_index
from stopexp.signals.pca import PCA


class Predictor(nn.Module):
    """forward(batch) -> (B,) raw logits; higher = the path is more likely to end correct.

    `inputs` names the batch keys the predictor reads, so callers can skip building the
    others (a predictor on signals only never needs the hidden states).

    `centre_prompts`: whether it centres each hidden state on its prompt's live paths in
    the batch (stopexp.signals.centring), so that a row's score depends on its peers and
    a batch is split only between whole groups of them (`centring.peer_chunks`).

    `fit_inputs(rows)`: what the predictor fits on the training rows before training (the
    PCA of predictor.pca_components); nothing by default."""
    inputs: tuple[str, ...] = ()
    centre_prompts: bool = False

    def __init__(self, spec: FeatureSpec):
        super().__init__()
        self.spec = spec

    def fit_inputs(self, rows: dict) -> None:
        """Fit what the inputs need on the training rows `rows` (every training path at
        every position trained on), once, before the first epoch."""


class OnTappedLayer(Predictor):
    """A head on one tapped layer's hidden state (`predictor.layer`), centred on its
    prompt's live paths where `predictor.centre_prompts` is set, then layer-normalised or,
    with `predictor.pca_components` = k, projected on its k leading principal axes fitted
    on the training rows instead (stopexp.signals.pca), with the prefix length as one more
    input where `predictor.position_input` is set; a subclass makes `self.head` on
    `self.in_dim` inputs."""
    inputs = ("hidden",)

    def __init__(self, predictor, spec: FeatureSpec, affine_norm: bool):
        super().__init__(spec)
        self.tap = tap_index(predictor.layer, spec)
        # keys a checkpoint may lack (saved before they existed): off
        self.position_input = bool(getattr(predictor, "position_input", False))
        self.centre_prompts = bool(getattr(predictor, "centre_prompts", False))
        k = getattr(predictor, "pca_components", None)
        if self.position_input:
            self.inputs = ("hidden", "prefix_len")
        if k is None:
            self.norm = nn.LayerNorm(spec.hidden_size, elementwise_affine=affine_norm)
        else:
            self.pca = PCA(spec.hidden_size, int(k))
        self.state_dim = spec.hidden_size if k is None else int(k)
        self.in_dim = self.state_dim + self.position_input

    def tapped(self, batch: dict) -> torch.Tensor:
        """(B, H): the tapped layer's state of each row, centred where the predictor centres."""
        x = hidden_of(batch, self.spec)[:, self.tap]
        return centred(x, batch) if self.centre_prompts else x

    def fit_inputs(self, rows: dict) -> None:
        if hasattr(self, "pca"):  # on the states as the head reads them: centred where it centres
            self.pca.fit(self.tapped(rows))

    def state(self, batch: dict) -> torch.Tensor:
        """(B, state_dim): the tapped state normalised (or projected) for the head."""
        x = self.tapped(batch)
        return self.pca(x) if hasattr(self, "pca") else self.norm(x)

    def forward(self, batch: dict) -> torch.Tensor:
        x = self.state(batch)
        if self.position_input:
            x = torch.cat([x, position_feature(batch)], dim=-1)
        return self.head(x).squeeze(-1)
