"""Per-step predictors and AUROC against prefix length: one row per (path, position).

A *position batch* holds one row per (path, stored position) where the path is still
generating, with the keys of `feature_rows.tensors_at` plus "position" (B,) int64 (the prefix in
generated tokens) and "path" (B,) int64 (the path's row in the split's bank). Everything
here consumes that dict; `position_data` is the one place that makes it.

- Training on every position (`train.positions=all`): the losses mine pairs within
  (prompt, position), never across positions (`pair_groups` becomes the batch's "group";
  the prompt stays in "prompt_group"), and epochs are selected on the validation
  within-prompt AUROC averaged over positions (`mean_over_positions`).
- AUROC against prefix length (stopexp.metrics.ranking.auroc_by_position) over the
  position batch, for training's curves and evaluate's (stopexp.evaluation.curves).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from stopexp.metrics import is_binary
from stopexp.store import bank, feature_rows
from stopexp.training.data import NothingToLearn, first_prompts


def position_data(ds, feats) -> dict | None:
    """The position batch of a bank split `ds` and its features `feats` (as
    `feature_rows.load_split` returns them): `feature_rows.position_batch` at every stored
    position, alive rows only; None when the split holds no path. The one source of
    position batches: every consumer below reads what this returns."""
    if not len(ds):
        return None
    rows = feature_rows.position_batch(ds, feats)
    return bank.select_rows(rows, rows["alive"])


def position_rows(features, split: str, overrides: list[str] | None = None) -> tuple:
    """(the `split` paths of the trace bank of `features` (a FeatureSet), their position
    batch: `position_data`, None when the bank holds none); `overrides`: the command
    line's, for the commands that make or repair the features."""
    ds, feats = feature_rows.load_split(features, split, overrides)
    return ds, position_data(ds, feats)


def pair_groups(group: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """(B,) int64 dense ids of the (prompt group, position) pairs: rows share an id iff
    they share both, so pairs mined by the losses never cross positions."""
    keys = torch.stack([torch.as_tensor(group), torch.as_tensor(position)], dim=1).numpy()
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64))


def training_rows(rows: dict) -> dict:
    """A position batch as training data: "group" the (prompt, position) pair id (what the
    pairwise losses and the prompt batches group by), "prompt_group" the prompt's."""
    return {**rows, "prompt_group": rows["group"], "group": pair_groups(rows["group"], rows["position"])}


def mean_over_positions(curve: dict) -> float:
    """The mean of a curve's AUROCs over the positions with a mixed prompt (NaN if none)."""
    values = [a for a in curve["auroc"] if math.isfinite(a)]
    return float(np.mean(values)) if values else math.nan


def usable_groups(rows: dict, min_gap: float = 0.0) -> int:
    """How many (prompt, position) groups of training rows (`training_rows`: "group" the
    pair id) hold a pair the losses can learn from: a correct and a wrong path, or, where
    the reward is continuous, two paths whose rewards differ by more than `min_gap` (the
    pair losses' loss.min_gap; as `train.check_usable`)."""
    group = np.asarray(rows["group"])
    label = np.asarray(rows["reward"] if "reward" in rows else rows["correct"], dtype=float)
    if "reward" in rows and is_binary(label):
        label = np.asarray(rows["correct"], dtype=float)
    if not len(group):
        return 0
    order = np.argsort(group, kind="stable")
    g, v = group[order], label[order]
    starts = np.r_[0, np.nonzero(g[1:] != g[:-1])[0] + 1]
    gap = min_gap if "reward" in rows and not is_binary(label) else 0.0
    return int((np.maximum.reduceat(v, starts) - np.minimum.reduceat(v, starts) > gap).sum())


def split_data_all(loaded: dict, min_gap: float, max_prompts: int | None = None) -> dict[str, dict]:
    """train.positions=all: per split, the training rows of every stored position, from
    `loaded` (split -> (ds, feats) of `feature_rows.load_split`, the splits the bank holds);
    of the train split, only the rows of its first `max_prompts` prompts
    (`stopexp.training.data.first_prompts`; None: all); `min_gap`:
    `stopexp.training.data.pair_min_gap`. Raises NothingToLearn when train or val has no
    (prompt, position) with both a correct and a wrong path."""
    out = {}
    for split, (ds, feats) in loaded.items():
        rows = position_data(ds, feats)
        if rows is not None and split == "train":
            chosen = first_prompts(np.asarray(ds["prompt_id"][:]), max_prompts)
            rows = bank.select_rows(rows, torch.from_numpy(chosen[rows["path"].numpy()]))
        if rows is not None and len(rows["correct"]):
            out[split] = training_rows(rows)
    for split in ("train", "val"):
        data = out.get(split)
        n = len(data["correct"]) if data else 0
        if n and usable_groups(data, min_gap):
            continue
        raise NothingToLearn(
            f"train.positions: all: the {split} split has no usable pair at any of the bank's "
            f"stored positions ({n} alive path positions): no prompt has both "
            f"a correct and a wrong path (or, with a continuous reward, two paths of different "
            f"rewards) alive at one position. Collect more prompts "
            f"(collect.prompts.{split}), keep prompts with mixed outcomes (collect.keep_correct), "
            f"or try another task.seed or seed.")
    return out
