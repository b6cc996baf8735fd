"""The prefixes' keys and values kept across the super token's training epochs.

The super token's LoRA is off on the prefix (stopexp.models.super_token): a prefix's K/V
do not change while the adapter trains, so re-encoding every prefix in every epoch (most
of an epoch's time) buys nothing. This cache keeps each row's K/V, a prompt's once for all
of its paths, up to a byte budget (train.prefix_cache_gb); a row that does not fit is
encoded again when it comes back, as without a cache. `assemble` lays cached rows out as
one left-padded batch cache, with the attention mask and the next position id per row
that `SuperTokenPredictor.score_cache` reads. Given `free_gib` (the memory free on its
device now) it also keeps nothing that would leave less than `reserve_gb` free: the budget
is set before training, and a training step's own memory (the batch's K/V and their copies,
activations, gradients) must still fit when the cache is full.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import DynamicCache

GIB = 1024 ** 3


def _slice(cache, row: int, start: int, stop: int) -> torch.Tensor:
    """Positions start:stop of `row` of a batch cache, every layer's keys and values in one
    new tensor: (layers, 2, kv heads, stop - start, head dim)."""
    return torch.stack([torch.stack([layer.keys[row, :, start:stop], layer.values[row, :, start:stop]])
                        for layer in cache.layers])


class PrefixCache:
    def __init__(self, budget_gb: float, free_gib: Callable[[], float] | None = None,
                 reserve_gb: float = 0.0):
        self.budget = int(budget_gb * GIB)
        self.free_gib, self.reserve = free_gib, int(reserve_gb * GIB)
        self.at_reserve = False  # whether a row was left out to keep the reserve free
        self.bytes = 0
        self.prompts: dict[tuple, torch.Tensor] = {}  # prompt ids -> (layers, 2, kv heads, P, head dim)
        self.rows: dict[tuple, torch.Tensor] = {}     # (prompt ids, generated ids) -> the generated part's

    def __contains__(self, row: tuple) -> bool:
        return row in self.rows

    def store(self, rows: list[tuple], cache, mask: torch.Tensor) -> None:
        """Keep the K/V of `rows` ((prompt ids, generated ids) each) from the batch `cache`
        that SuperTokenPredictor.encode made of them (its layout: prompts left-padded to one
        width, the generated ids after it, right-padded; `mask` marks what is real), as
        far as the budget allows. Slices are copied: the batch's tensors are freed."""
        width = mask.shape[1] - max(len(gen) for _, gen in rows)
        room = float("inf") if self.free_gib is None else self.free_gib() * GIB - self.reserve
        for r, (prompt, gen) in enumerate(rows):
            if (prompt, gen) in self.rows:
                continue
            new_prompt = prompt not in self.prompts
            p_kv = _slice(cache, r, width - len(prompt), width) if new_prompt else self.prompts[prompt]
            g_kv = _slice(cache, r, width, width + len(gen))
            size = g_kv.nbytes + (p_kv.nbytes if new_prompt else 0)
            if size > room:
                self.at_reserve = True
                continue
            if self.bytes + size > self.budget:
                continue  # encoded again when it comes back; a smaller row may still fit
            self.prompts[prompt], self.rows[(prompt, gen)] = p_kv, g_kv
            self.bytes += size
            room -= size

    def assemble(self, rows: list[tuple], cache: DynamicCache) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """(cache, attention mask, next positions) of cached `rows`, each row left-padded to
        the longest, filled into the empty `cache`: the layout SuperTokenPredictor.score_cache
        takes."""
        lengths = [len(prompt) + len(gen) for prompt, gen in rows]
        width = max(lengths)
        layers, _, heads, _, dim = self.rows[rows[0]].shape
        device = self.rows[rows[0]].device
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for r, n in enumerate(lengths):
            mask[r, width - n:] = 1
        for layer in range(layers):  # a layer at a time: the batch is never held twice
            kv = self.rows[rows[0]].new_zeros((2, len(rows), heads, width, dim))
            for r, ((prompt, gen), n) in enumerate(zip(rows, lengths)):
                start = width - n
                kv[:, r, :, start:start + len(prompt)] = self.prompts[prompt][layer]
                kv[:, r, :, start + len(prompt):] = self.rows[(prompt, gen)][layer]
            cache.update(kv[0], kv[1], layer)
            del kv
        return cache, mask, torch.tensor(lengths, device=device)
