"""hidden_conf: one tapped layer's hidden state fused with the confidence columns of
conf_features, the question "does the hidden state add anything to confidence?" asked of
one predictor: against conf_features (the same columns, the same head, no hidden state) its
difference is what the hidden state adds.

    h -> [centre] -> LayerNorm (or PCA)  -> Linear(H, hidden) --+
                                                                +-> GELU -> Dropout -> [Linear(., hidden) -> GELU -> Dropout] x (depth - 1) -> Linear(., 1)
    confidence columns -> BatchNorm      -> Linear(S, hidden) --+

The first hidden layer is split: `hidden` units read the hidden state, `hidden` units the
confidence columns (conf_features' CONF_SIGNALS plus `predictor.signals`), each from its
own projection, so the few confidence columns are not drowned among the H components of
the state at initialisation (one Linear over their concatenation would give them 5 of
H + 5 inputs). The state is read as the single-tap heads read it (`OnTappedLayer`:
predictor.layer, centre_prompts, pca_components); the columns are standardised as
conf_features standardises them (a BatchNorm without affine parameters). The position is
among the columns (prefix_len), so predictor.position_input is refused."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.base import OnTappedLayer
from stopexp.signals.conf_features import CONF_SIGNALS
from stopexp.signals.feature_spec import FeatureSpec, signal_columns
from stopexp.signals.mlp import mlp_head


class HiddenConfPredictor(OnTappedLayer):
    inputs = ("hidden", "signals")

    def __init__(self, predictor, spec: FeatureSpec):
        super().__init__(predictor, spec, affine_norm=True)
        if self.position_input:  # validate refuses it first (stopexp.config.predictor)
            raise ValueError("predictor.position_input: hidden_conf reads prefix_len among its signal columns")
        if predictor.depth < 1:
            raise ValueError(f"predictor.depth: hidden_conf's first hidden layer fuses its two inputs, "
                             f"so depth must be >= 1, got {predictor.depth}")
        extra = getattr(predictor, "signals", None) or []
        names = (*CONF_SIGNALS, *[n for n in extra if n not in CONF_SIGNALS])
        self.register_buffer("columns", torch.tensor(signal_columns(names, spec)), persistent=False)
        # momentum=None: the running stats are the plain average over all training batches
        self.signal_norm = nn.BatchNorm1d(len(names), affine=False, momentum=None)
        self.hidden_proj = nn.Linear(self.state_dim, predictor.hidden)
        self.signal_proj = nn.Linear(len(names), predictor.hidden)
        self.head = nn.Sequential(nn.GELU(), nn.Dropout(predictor.dropout),
                                  mlp_head(2 * predictor.hidden, predictor.hidden,
                                           predictor.depth - 1, predictor.dropout))

    def forward(self, batch: dict) -> torch.Tensor:
        signals = self.signal_norm(batch["signals"][:, self.columns])
        fused = torch.cat([self.hidden_proj(self.state(batch)), self.signal_proj(signals)], dim=-1)
        return self.head(fused).squeeze(-1)
