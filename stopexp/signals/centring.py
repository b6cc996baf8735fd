"""Per-prompt centring of hidden states (predictor.centre_prompts): each row's hidden state
minus the mean hidden state of its *peers*, the live paths of the same prompt at the same
position in the batch. What all paths of a prompt share (the question, its difficulty) is
removed, leaving what sets a path apart from its siblings: the signal a within-prompt
ranking needs.

The peers are found in the batch itself, so a batch must hold every live path of the
prompts it scores at each position, as every scoring batch does (replay: all paths of the
split at a check, "alive" marking the live ones; online: every live path of the prompts at
the check; beams: every live beam; training: whole prompts or (prompt, position) groups).
`peer_chunks` splits a large batch without cutting a prompt's peers apart.

The prompt of a row is batch["group"] where the batch has it, else batch["owner"] (beam
search), else the prompt named by batch["seed_key"] (online; `st_bon.prompt_groups`); its
position is batch["prefix_len"]. Rows that are not live (replay's paths that ended before
the check) are nobody's peer; a row without a live peer keeps its hidden state.
"""
from __future__ import annotations

import numpy as np
import torch

from stopexp.signals.st_bon import prompt_groups


def prompt_of(batch: dict) -> torch.Tensor:
    """(B,) int64 on the CPU: rows with equal values are paths of one prompt."""
    if batch.get("group") is None and batch.get("owner") is not None:
        return torch.as_tensor(batch["owner"], dtype=torch.int64).cpu()
    return prompt_groups(batch).cpu()


def peer_keys(batch: dict) -> torch.Tensor:
    """(B,) int64 dense ids on the CPU: rows share an id iff they share the prompt and the
    position (prefix_len)."""
    prompt = prompt_of(batch)
    position = torch.as_tensor(batch["prefix_len"]).detach().cpu().round().to(torch.int64)
    if not len(prompt):
        return prompt
    return torch.unique(torch.stack([prompt, position], dim=1), dim=0, return_inverse=True)[1]


def centred(hidden: torch.Tensor, batch: dict) -> torch.Tensor:
    """`hidden` (B, ...), one row per row of `batch`, minus the mean of each row's live
    peers (see the module docstring)."""
    if not len(hidden):
        return hidden
    keys = peer_keys(batch).to(hidden.device)
    alive = batch.get("alive")
    live = torch.ones(len(keys), dtype=torch.bool, device=hidden.device) if alive is None \
        else torch.as_tensor(alive, dtype=torch.bool).to(hidden.device)
    n = int(keys.max()) + 1
    sums = hidden.new_zeros((n, *hidden.shape[1:])).index_add_(0, keys[live], hidden[live])
    counts = torch.bincount(keys[live], minlength=n).clamp(min=1).to(hidden.dtype)
    means = sums / counts.reshape(-1, *([1] * (hidden.dim() - 1)))
    return hidden - means[keys]  # no live peer: a mean of 0, the row unchanged


def peer_chunks(batch: dict, chunk: int) -> list[torch.Tensor]:
    """Row indices of `batch` in chunks of about `chunk` rows (more where one group of peers
    is larger), each holding whole groups of peers, so that a predictor that centres scores
    every chunk as it would the whole batch."""
    keys = peer_keys(batch).numpy()
    order = np.argsort(keys, kind="stable")
    starts = np.r_[0, np.nonzero(np.diff(keys[order]))[0] + 1]  # where each group begins
    out, begin = [], 0
    for start in [*starts[1:], len(keys)]:
        if start - begin >= chunk or start == len(keys):
            out.append(torch.from_numpy(np.sort(order[begin:start])))
            begin = start
    return [c for c in out if len(c)]
