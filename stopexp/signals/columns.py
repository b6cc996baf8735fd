"""The non-learnable signal columns of a predictor batch, computed by one function for
collection (stopexp.search.trace), online pruning (stopexp.search.lcr) and beam
search (stopexp.search.beam), so that a replayed signal equals the online one.

The hidden-state statistics read the current token's hidden state at the *deepest tapped
layer* (`hidden[:, -1]`: taps are ordered shallowest first), in float32:
- hidden_norm: its L2 norm;
- hidden_mean: the mean of its H components;
- hidden_var: the population variance of its H components (divided by H, not H - 1).

attn_entropy is the mean entropy (nats) of the chosen heads' attention at the current
token (`stopexp.search.taps`, tap.attention_heads); 0 where attention is not tapped.
"""
from __future__ import annotations

import torch

from stopexp.signals.confidence import confidence_signals
from stopexp.signals.feature_spec import SIGNAL_NAMES


def hidden_statistics(hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """hidden: (B, n_tap_layers, H). Returns hidden_norm, hidden_mean, hidden_var, each
    (B,) float32 on the CPU, of the deepest tapped layer."""
    deepest = hidden[:, -1].float().cpu()
    return {"hidden_norm": deepest.norm(dim=-1), "hidden_mean": deepest.mean(-1),
            "hidden_var": deepest.var(-1, correction=0)}


def signal_matrix(logprob: torch.Tensor, entropy: torch.Tensor, conf: torch.Tensor,
                  prefix: torch.Tensor, window: int, hidden: torch.Tensor,
                  attn: torch.Tensor | None = None) -> torch.Tensor:
    """(B, len(SIGNAL_NAMES)) float32: the columns of SIGNAL_NAMES for B prefixes, from
    their (B, T) per-token log-probs, entropies and DeepConf confidences (the first
    `prefix[i]` tokens count; `stopexp.signals.confidence`), their (B,) prefix lengths,
    DeepConf's group `window`, their (B, n_tap_layers, H) tapped hidden states and their
    (B,) attention entropy (None: not tapped, the column is 0)."""
    sig = confidence_signals(logprob, entropy, conf, prefix, window)
    sig.update(hidden_statistics(hidden))
    B = hidden.shape[0]
    sig["attn_entropy"] = torch.zeros(B) if attn is None else attn.float().cpu().reshape(B)
    return torch.stack([sig[name].float() for name in SIGNAL_NAMES], -1)
