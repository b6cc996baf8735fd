"""Control: the MLP of `mlp.py` on token-confidence signals only, no hidden state (and not
hidden_norm, which is a statistic of it). If this matches the hidden-state predictors,
the hidden state adds nothing beyond confidence.

The signals have unrelated units (log-probs, nats, tokens), so each column is
standardised on its own by a BatchNorm without affine parameters (batch statistics in
training, their running average in eval) instead of a LayerNorm across columns, which
would let prefix_len (hundreds of tokens) swamp the rest.

`predictor.signals` adds columns to its inputs (e.g. [attn_entropy]: confidence plus the
attention entropy); empty, it is the confidence-only control."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.base import Predictor
from stopexp.signals.feature_spec import FeatureSpec, signal_columns
from stopexp.signals.mlp import mlp_head

CONF_SIGNALS = ("mean_logprob", "min_logprob", "mean_entropy", "group_conf", "prefix_len")


class ConfFeaturesPredictor(Predictor):
    inputs = ("signals",)

    def __init__(self, predictor, spec: FeatureSpec):
        super().__init__(spec)
        extra = getattr(predictor, "signals", None) or []  # a checkpoint saved without the key: none
        names = (*CONF_SIGNALS, *[n for n in extra if n not in CONF_SIGNALS])
        self.register_buffer("columns", torch.tensor(signal_columns(names, spec)),
                             persistent=False)
        # momentum=None: the running stats are the plain average over all training batches
        self.norm = nn.BatchNorm1d(len(names), affine=False, momentum=None)
        self.head = mlp_head(len(names), predictor.hidden, predictor.depth, predictor.dropout)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.head(self.norm(batch["signals"][:, self.columns])).squeeze(-1)
