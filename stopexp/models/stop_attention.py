"""The attention of the super token's [STOP] positions, with the cached prefix held constant.

The super token trains only what acts on [STOP] (stopexp.models.super_token): the prefix's
keys and values come from the cache, computed without LoRA, and need no gradient. PyTorch's
fused attention differentiates with respect to every key and value it is given, so its
backward fills and computes gradients the size of the whole prefix cache, in every layer,
for the few [STOP] positions. Here the scores are split into the prefix's (its keys and
values detached: their backward is a matmul against the few queries) and the [STOP]
positions' own, under one softmax: the same attention (grouped-query heads without copies
of the keys), a fraction of the backward. The prefix is read in float32 without being kept
in float32: its products save the cached (half-precision) tensors and upcast them again in
the backward (`constant_matmul`), where a float32 copy of every layer's prefix would be held
until the backward (a SmolLM2 training step of 256 paths of 421 tokens peaks 6.4 GiB above
the loaded LM, 9.0 GiB with the float32 copies: scripts/bench_super_token_train.py).
Registered as an attention implementation of transformers (its mask: the eager one,
additive); `stop_attention(lm)` switches the LM to it for the scoring call only.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

NAME = "stopexp_stop"
# what some models' own attention adds (logit soft-capping, sink logits): refused rather
# than left out
UNSUPPORTED = ("softcap", "s_aux")


class _ConstantMatmul(torch.autograd.Function):
    """a @ c in float32, c a constant given in any precision: c is saved as given (no copy)
    and upcast again for a's gradient."""

    @staticmethod
    def forward(ctx, a, c):
        ctx.save_for_backward(c)
        return a @ c.float()

    @staticmethod
    def backward(ctx, grad):
        (c,) = ctx.saved_tensors
        return grad @ c.float().transpose(-1, -2), None


def constant_matmul(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a (float32, differentiable) @ c (held constant: no gradient) in float32."""
    return _ConstantMatmul.apply(a, c.detach())


def prefix_constant_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """(attention output (B, n, heads, head dim), None) of the n newest positions (`query`,
    B x heads x n x head dim) over `key` / `value` (B x kv heads x L x head dim, the cache
    and these n positions last); `attention_mask` additive, B x 1 x n x L."""
    found = [k for k in UNSUPPORTED if kwargs.get(k) is not None]
    if found:
        raise ValueError(f"predictor=super_token: this model's attention has {', '.join(found)}, "
                         "which the [STOP] attention (stopexp/models/stop_attention.py) does not apply")
    B, heads, n, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups, past = heads // kv_heads, length - n
    # in float32, as fused kernels accumulate: half-precision scores would round the small
    # differences between paths that the head ranks
    q = query.float().reshape(B, kv_heads, groups * n, dim)  # query head h = kv head h // groups
    scores = torch.cat([constant_matmul(q, key[:, :, :past].transpose(-1, -2)),
                        q @ key[:, :, past:].float().transpose(-1, -2)], -1) * scaling
    scores = scores.view(B, kv_heads, groups, n, length)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, :length].float()
    weights = torch.softmax(scores, -1).view(B, kv_heads, groups * n, length)
    out = (constant_matmul(weights[..., :past], value[:, :, :past])
           + weights[..., past:] @ value[:, :, past:].float())
    return out.view(B, heads, n, dim).transpose(1, 2).to(query.dtype).contiguous(), None


AttentionInterface.register(NAME, prefix_constant_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)


@contextmanager
def stop_attention(lm):
    """`lm` attends with `prefix_constant_attention` inside the block."""
    before = lm.config._attn_implementation
    lm.config._attn_implementation = NAME
    try:
        yield
    finally:
        lm.config._attn_implementation = before
