"""ST-BoN (Wang et al., "Sampling-Efficient Test-Time Scaling: Self-Estimating the Best-of-N
Sampling in Early Decoding", arXiv 2503.01422): training-free self-consistency of the
paths' internal states. At the check, each path's chain-of-embedding (CoE) feature is
compared with those of the other live paths of its prompt; the path closest to the others
is the most consistent, and ST-BoN keeps it (policy.keep=1 is the paper's setting; a larger
K keeps the K most consistent).

The CoE feature here is the chain of tapped hidden states at the check (tap.layers, each
L2-normalised, so a layer's scale does not dominate; with tap.pooling=mean it is the mean
over the prefix, as in the CoE paper). The distance between two paths is the mean over
tapped layers of the Euclidean distance of their normalised states; a path's score is
minus its mean distance to the other live paths of the same prompt (higher = keep). A path
alone in its prompt scores 0.

The peers of a path are the rows that share its prompt: batch["group"] where the batch has
it (replay, training data), else the prefix of batch["seed_key"] before the last "/"
(online; streams are named "<prompt>/<path id>"), restricted to batch["alive"] when present
(replay also scores paths that ended before the check; they are nobody's peer). Without
either (beam search) all rows are one prompt's.
"""
from __future__ import annotations

import torch


def prompt_groups(batch: dict) -> torch.Tensor:
    """(B,) int64: rows with equal values belong to one prompt."""
    if batch.get("group") is not None:
        return torch.as_tensor(batch["group"], dtype=torch.int64)
    keys = batch.get("seed_key")
    if not keys:
        return torch.zeros(len(batch["hidden"]), dtype=torch.int64)
    index: dict = {}
    return torch.tensor([index.setdefault(k.rsplit("/", 1)[0], len(index)) for k in keys])


@torch.no_grad()
def st_bon(batch: dict) -> torch.Tensor:
    """(B,) minus the mean distance of each path's CoE feature to its live peers' (see the
    module docstring); batch["hidden"] is (B, n_tap_layers, H)."""
    h = torch.nn.functional.normalize(batch["hidden"].double(), dim=-1)
    alive = batch.get("alive")
    alive = torch.ones(len(h), dtype=torch.bool) if alive is None else torch.as_tensor(alive, dtype=torch.bool)
    group = prompt_groups(batch)
    score = torch.zeros(len(h), dtype=torch.float64)
    for g in group.unique():
        rows = torch.nonzero(group == g).squeeze(-1)
        peers = rows[alive[rows]]
        if len(peers) < 2:
            continue
        # (R, P): mean over layers of the distance between row r and peer p
        dist = torch.cdist(h[rows].transpose(0, 1), h[peers].transpose(0, 1),
                             compute_mode="donot_use_mm_for_euclid_dist").mean(0)
        own = (rows[:, None] == peers[None, :]).to(dist.dtype)  # a path is not its own peer
        n_others = len(peers) - own.sum(1)
        score[rows] = -(dist * (1 - own)).sum(1) / n_others.clamp(min=1)
    return score.float()
