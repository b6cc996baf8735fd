"""Non-learnable signals of a path prefix, from its per-token log-probs, entropies and
DeepConf token confidences. One function serves collection, online pruning and replay,
so a signal means the same thing everywhere."""
from __future__ import annotations

import numpy as np
import torch


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """Entropy of each row's distribution, given as log-probs (tokens a filter set to -inf
    count 0)."""
    return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)


def token_confidence(logp: torch.Tensor, k: int) -> torch.Tensor:
    """DeepConf's token confidence: minus the mean log-prob of each row's k likeliest tokens."""
    return -logp.topk(min(k, logp.shape[-1]), dim=-1).values.mean(-1)


def confidence_signals(logprob: torch.Tensor, entropy: torch.Tensor, conf: torch.Tensor,
                       prefix: torch.Tensor, window: int) -> dict[str, torch.Tensor]:
    """Signals of the first `prefix[i]` tokens of each row of the (P, T) token arrays.

    - mean_logprob, min_logprob: of the sampled tokens;
    - mean_entropy: of the sampling distribution;
    - group_conf: DeepConf's lowest group confidence, the minimum over sliding windows of
      `window` tokens of the mean token confidence (over the whole prefix when shorter);
    - prefix_len: the prefix length itself.
    """
    P, T = logprob.shape
    prefix = prefix.clamp(1, T).long()
    pos = torch.arange(T).expand(P, T)
    inside = pos < prefix[:, None]
    n = prefix.float()
    mean_lp = (logprob * inside).sum(1) / n
    min_lp = logprob.masked_fill(~inside, float("inf")).min(1).values
    mean_ent = (entropy * inside).sum(1) / n
    # windowed means from a cumulative sum; a window counts only when it lies in the prefix
    w = min(window, T)
    csum = torch.nn.functional.pad(torch.cumsum(conf * inside, 1), (1, 0))
    win_mean = (csum[:, w:] - csum[:, :-w]) / w                  # (P, T-w+1), start s
    starts = torch.arange(T - w + 1).expand(P, -1)
    full = starts + w <= prefix[:, None]
    lowest = win_mean.masked_fill(~full, float("inf")).min(1).values
    short = prefix < w  # no full window: the mean over the prefix
    group = torch.where(short, (conf * inside).sum(1) / n, lowest)
    return {"mean_logprob": mean_lp, "min_logprob": min_lp, "mean_entropy": mean_ent,
            "group_conf": group, "prefix_len": n}


def token_stats(logprobs: list, token_ids: list[int], top: int, conf_topk: int):
    """(log-prob, entropy, confidence) per generated token from vLLM's per-position
    {token id: Logprob} (the sampled token and the `top` best by rank): the entropy of the
    returned alternatives renormalised, the confidence minus the mean of the best
    `conf_topk` of them (in float64, stored as float32)."""
    n = len(token_ids)
    best = np.full((n, top), -np.inf)   # by rank; -inf where vLLM returned none
    given = np.zeros((n, top), dtype=bool)
    lp = np.zeros(n)
    for t, (position, token) in enumerate(zip(logprobs, token_ids)):
        lp[t] = position[token].logprob
        for x in position.values():
            if x.rank is not None and x.rank <= top:
                best[t, x.rank - 1], given[t, x.rank - 1] = x.logprob, True
    finite = np.where(given, best, -np.inf)
    peak = np.max(finite, axis=1, keepdims=True) if n else np.zeros((0, 1))
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q = finite - peak - np.log(np.exp(finite - peak).sum(axis=1, keepdims=True))
        ent = -np.nan_to_num(np.exp(log_q) * log_q, nan=0.0).sum(axis=1)
        k = min(conf_topk, top)
        conf = -np.where(given[:, :k], best[:, :k], 0.0).sum(axis=1) / given[:, :k].sum(axis=1)
    return lp.astype(np.float32), ent.astype(np.float32), conf.astype(np.float32)
