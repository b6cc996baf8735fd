"""The prefixes' keys and values kept across the super token's training epochs.

The super token's LoRA is off on the prefix (stopexp.models.super_token): a prefix's K/V
do not change while the adapter trains, so re-encoding every prefix in every epoch (most
of an epoch's time) buys nothing. This cache keeps each row's K/V, a prompt's once for all
of its paths, up to a byte budget (train.prefix_cache_gb); a row that does not fit is
encoded again when it comes back, as without a cache. `assemble` lays cached rows out as
one left-padded batch cache, with the attention mask and the next position id per row
that `SuperTokenPredictor.score_cache` reads.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

GIB = 1024 ** 3


def _nbytes(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


class PrefixCache:
    def __init__(self, budget_gb: float):
        self.budget = int(budget_gb * GIB)
        self.bytes = 0
        self.prompts: dict[tuple, list] = {}  # prompt ids -> per layer (keys, values): (kv heads, P, head dim)
        self.rows: dict[tuple, list] = {}     # (prompt ids, generated ids) -> the same for the generated part

    def __contains__(self, row: tuple) -> bool:
        return row in self.rows

    def store(self, rows: list[tuple], cache, mask: torch.Tensor) -> None:
        """Keep the K/V of `rows` ((prompt ids, generated ids) each) from the batch `cache`
        that SuperTokenPredictor.encode made of them (its layout: prompts left-padded to one
        width, the generated ids after it, right-padded; `mask` marks what is real), as
        far as the budget allows. Slices are copied: the batch's tensors are freed."""
        width = mask.shape[1] - max(len(gen) for _, gen in rows)
        for r, (prompt, gen) in enumerate(rows):
            if (prompt, gen) in self.rows:
                continue
            new_prompt = prompt not in self.prompts
            p_kv = [(layer.keys[r, :, width - len(prompt):width].clone(),
                     layer.values[r, :, width - len(prompt):width].clone())
                    for layer in cache.layers] if new_prompt else self.prompts[prompt]
            g_kv = [(layer.keys[r, :, width:width + len(gen)].clone(),
                     layer.values[r, :, width:width + len(gen)].clone()) for layer in cache.layers]
            size = _nbytes(g_kv) + (_nbytes(p_kv) if new_prompt else 0)
            if self.bytes + size > self.budget:
                return  # full: later rows are encoded again when they come back
            self.prompts[prompt] = p_kv
            self.rows[(prompt, gen)] = g_kv
            self.bytes += size

    def assemble(self, rows: list[tuple], config) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """(cache, attention mask, next positions) of cached `rows`, each row left-padded to
        the longest: the layout SuperTokenPredictor.score_cache takes."""
        lengths = [len(prompt) + len(gen) for prompt, gen in rows]
        width = max(lengths)
        first = self.rows[rows[0]][0][0]
        heads, dim = first.shape[0], first.shape[-1]
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=first.device)
        for r, n in enumerate(lengths):
            mask[r, width - n:] = 1
        cache = DynamicCache(config=config)
        for layer in range(len(self.rows[rows[0]])):
            keys = first.new_zeros((len(rows), heads, width, dim))
            values = first.new_zeros((len(rows), heads, width, dim))
            for r, (prompt, gen) in enumerate(rows):
                (pk, pv), (gk, gv) = self.prompts[prompt][layer], self.rows[(prompt, gen)][layer]
                start = width - lengths[r]
                keys[r, :, start:start + len(prompt)], values[r, :, start:start + len(prompt)] = pk, pv
                keys[r, :, start + len(prompt):], values[r, :, start + len(prompt):] = gk, gv
            cache.update(keys, values, layer)
        return cache, mask, torch.tensor(lengths, device=first.device)
