"""The predictor's rows: a bank split joined with its features, at one checkpoint
(`tensors_at`) or at every stored position (`position_batch`), read once per version of
the features (read-only, shared)."""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from datasets import load_from_disk

from stopexp.core.errors import error_text
from stopexp.signals.columns import signal_matrix
from stopexp.signals.feature_spec import SIGNAL_NAMES
from stopexp.store import bank
from stopexp.store.feature_sets import (FEATURES_VERSION, KIND, FeatureSet, repair_text, require_features,
                                       shape_problem)

log = logging.getLogger(__name__)


# ---- reading -----------------------------------------------------------------------------
@dataclass
class PathFeatures:
    """The features of the rows of one bank split, in the bank's row order (flat arrays:
    the positions of row i are `positions[offsets[i]:offsets[i + 1]]`)."""
    meta: dict
    offsets: np.ndarray      # (R + 1,) int64
    positions: np.ndarray    # (total,) int64, generated tokens
    hidden: np.ndarray       # (total, layers, H), float32 or float16
    attn: np.ndarray         # (total,) float32 (zeros without the attention tap)
    keys: np.ndarray         # (R, 2) prompt id, path id: the join check
    splits: np.ndarray       # (R,) split of each row: the join check

    @property
    def rows(self) -> np.ndarray:
        """(total,) the row of each stored position."""
        return np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))


def load_features(root: Path, split: str | None = None, repair: str | None = None) -> PathFeatures:
    """The features of the rows that `bank.load_bank(bank_root, split)` returns, in the
    same order, read-only. Raises BankMissing / BankDamaged naming the shard and file at
    fault. The artifact is verified on every call; its arrays are read once per version
    (meta.json) and split, since train and evaluate come back to a split for its curves."""
    root = Path(root)
    repair = repair or repair_text()
    bank.verify_bank(root, repair=repair, kind=KIND, version=FEATURES_VERSION)
    stamp = (root / "meta.json").stat()
    return _read_features(str(root.resolve()), split, repair, stamp.st_mtime_ns, stamp.st_size)


@functools.lru_cache(maxsize=3)
def _read_features(root: str, split: str | None, repair: str, _mtime_ns: int, _size: int
                   ) -> PathFeatures:
    """`load_features` after verification: the arrays of one version of the artifact."""
    root = Path(root)
    meta = bank.read_meta(root, repair, KIND)
    names = bank.shards_holding(meta, split)
    L, H = len(meta["tap_layers"]), meta["hidden_size"]
    counts, pos, hid, att, keys, splits = [], [], [], [], [], []
    for name in names:
        try:
            shard = load_from_disk(str(root / name))
            table, n = shard.data, shard.num_rows
            p = table.column("positions").combine_chunks()
            h = table.column("hidden").combine_chunks()
            h = getattr(h, "storage", h)  # the extension array's list<list<list<float>>>
            flat = h.flatten().flatten().flatten().to_numpy(zero_copy_only=False)
            a = table.column("attn").combine_chunks()
        except Exception as e:  # pyarrow / datasets name no file: say which shard it was
            raise bank.BankDamaged(f"features {root}: shard {name} cannot be read "
                                   f"({error_text(e)}); repair: {repair}") from e
        if n != meta["shards"][name]["rows"]:
            raise bank.BankDamaged(f"features {root}: shard {name} holds {n} rows, "
                                   f"{meta['shards'][name]['rows']} recorded; repair: {repair}")
        _check_shape(shard, len(flat), len(p.flatten()), (L, H), f"features {root}: shard {name}", repair)
        counts.append(np.diff(p.offsets.to_numpy()))
        pos.append(p.flatten().to_numpy().astype(np.int64))
        hid.append(flat.reshape(-1, L, H))
        att_flat = a.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
        att.append(att_flat if len(att_flat) else np.zeros(len(pos[-1]), np.float32))
        keys.append(np.stack([table.column("prompt_id").to_numpy(),
                              table.column("path_id").to_numpy()], 1).astype(np.int64))
        splits.append(np.asarray(table.column("split").to_pylist()))
    counts, positions = np.concatenate(counts), np.concatenate(pos)
    hidden, attn, keys, splits = np.concatenate(hid), np.concatenate(att), np.concatenate(keys), \
        np.concatenate(splits)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if split is not None:  # keep the split's rows, as load_bank does
        take = np.nonzero(splits == split)[0]
        flat = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in take]) if len(take) \
            else np.zeros(0, np.int64)
        positions, hidden, attn = positions[flat], hidden[flat], attn[flat]
        offsets = np.concatenate([[0], np.cumsum(counts[take])]).astype(np.int64)
        keys, splits = keys[take], splits[take]
    for array in (offsets, positions, hidden, attn, keys, splits):
        array.flags.writeable = False  # shared by every caller of this version and split
    return PathFeatures(meta, offsets, positions, hidden, attn, keys, splits)


def _check_shape(shard, values: int, positions: int, shape: tuple[int, int], where: str,
                 repair: str) -> None:
    """BankDamaged (`where`, `repair`) when a shard's hidden states are not `shape` (layers,
    width) per position, by its schema (feature_sets.shape_problem) or by its count of
    `values` for `positions`."""
    problem = shape_problem(shard.features["hidden"], shape)
    if problem is None and values != positions * shape[0] * shape[1]:
        problem = f"holds {values} hidden values for {positions} positions of {shape[0]} x {shape[1]}"
    if problem:
        raise bank.BankDamaged(f"{where} {problem}; repair: {repair}")


def _check_join(ds, feats: PathFeatures) -> None:
    keys = np.stack([np.asarray(ds["prompt_id"][:]), np.asarray(ds["path_id"][:])], 1)
    if keys.shape != feats.keys.shape or not (keys == feats.keys).all() or \
            not (np.asarray(ds["split"][:]) == feats.splits).all():
        raise ValueError(f"the features ({len(feats.keys)} paths) are not those of this bank split "
                         f"({len(keys)} paths): load both with the same split, from the bank "
                         "the features were made from")


def _token_arrays(ds):
    """(R, T) zero-padded per-token log-prob, entropy, confidence of the bank's rows."""
    cols = [ds[k][:] for k in ("token_logprob", "token_entropy", "token_conf")]
    length = np.asarray(ds["length"][:])
    T = max(1, int(length.max()) if len(length) else 1)
    out = [np.zeros((len(length), T), np.float32) for _ in cols]
    for arr, col in zip(out, cols):
        for i, v in enumerate(col):
            arr[i, : len(v)] = v
    return [torch.from_numpy(a) for a in out]


def _wrong_values(ds, rows=None) -> dict:
    """{"first_wrong_value": (R,) int64} of the bank's rows (all, or `rows`), when the bank
    has the column (error_oracle reads it); {} otherwise."""
    if "first_wrong_value" not in ds.column_names:
        return {}
    col = np.asarray(ds["first_wrong_value"][:]).astype(np.int64)
    return {"first_wrong_value": torch.from_numpy(col if rows is None else col[rows])}


def task_labels(ds) -> list[str]:
    """The tasks of a mixture's bank (its `task` column's names, in component order); []
    for a bank of one task."""
    return list(ds.features["task"].names) if "task" in ds.column_names else []


def _tasks(ds, rows=None) -> dict:
    """{"task": (R,) int64, each row's index in `task_labels`} where the bank records its
    paths' tasks (a mixture); {} otherwise."""
    if "task" not in ds.column_names:
        return {}
    col = np.asarray(ds["task"][:]).astype(np.int64)
    return {"task": torch.from_numpy(col if rows is None else col[rows])}


def _groups(ds) -> np.ndarray:
    splits, prompt_ids = np.asarray(ds["split"][:]), np.asarray(ds["prompt_id"][:])
    keys = np.char.add(np.char.add(splits.astype(str), "/"), prompt_ids.astype(str))
    return np.unique(keys, return_inverse=True)[1].astype(np.int64)


def _mc(ds, feats: PathFeatures, rows: np.ndarray, positions: np.ndarray,
        reward: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """The Monte Carlo label of each (row, position): the bank's mean rollout reward at its
    Monte Carlo checkpoints, NaN elsewhere while alive, the path's own reward once it
    ended (its outcome with reward=correct)."""
    mc = np.full(len(rows), np.nan, np.float32)
    where = list(feats.meta.get("mc_checkpoints", []))
    if where and len(rows):
        rates = np.asarray(ds["mc"][:], dtype=np.float32).reshape(len(ds), len(where))
        for j, c in enumerate(where):
            at = positions == c
            mc[at] = rates[rows[at], j]
    mc[~alive] = reward[rows][~alive]
    return mc


def tensors_at(ds, feats: PathFeatures, checkpoint: int) -> dict:
    """Everything a predictor or a pruning decision needs at prefix `checkpoint` (tokens),
    for every path of `ds` (a numpy-formatted bank split) joined with its features `feats`
    (`load_features` of the same split), as float32/int64 torch tensors: "hidden" (R,
    layers, H), "signals" (R, S), "group", "correct", "reward", "mc", "alive" (bool),
    "prefix_len", "remaining", "length" (R,), "first_wrong_value" and "task" where the bank
    has them. Rows not alive at the checkpoint have zero hidden states
    (their confidence columns cover the whole path). ValueError when an alive path's
    features lack the position (it is not among tap.checkpoints / tap.positions)."""
    _check_join(ds, feats)
    R = len(ds)
    length = np.asarray(ds["length"][:]).astype(np.int64)
    alive = length > checkpoint
    at = np.nonzero(feats.positions == checkpoint)[0]
    rows = feats.rows[at]
    if alive.sum() != len(rows):
        raise ValueError(f"the features hold no position {checkpoint} for some paths alive there; "
                         f"they hold the checkpoints {feats.meta['positions']['checkpoints']}, "
                         f"stride {feats.meta['positions']['stride']}: add it to tap.checkpoints "
                         "or tap.positions")
    L, H = feats.hidden.shape[1:] if feats.hidden.ndim == 3 else (len(feats.meta["tap_layers"]),
                                                                  feats.meta["hidden_size"])
    hidden = np.zeros((R, L, H), np.float32)
    hidden[rows] = feats.hidden[at]
    attn = np.zeros(R, np.float32)
    attn[rows] = feats.attn[at]
    prefix = np.minimum(length, checkpoint)
    correct = np.asarray(ds["correct"][:]).astype(np.float32)
    reward = bank.rewards_of(ds)
    signals = _signals(ds, None, prefix, hidden, attn, feats)
    mc = _mc(ds, feats, np.arange(R), np.full(R, checkpoint), reward, alive)
    return {
        "hidden": torch.from_numpy(hidden), "signals": signals,
        "group": torch.from_numpy(_groups(ds)),
        "correct": torch.from_numpy(correct), "reward": torch.from_numpy(reward),
        "mc": torch.from_numpy(mc), "alive": torch.from_numpy(alive),
        "prefix_len": torch.from_numpy(prefix.astype(np.float32)),
        "remaining": torch.from_numpy(np.maximum(length - checkpoint, 0).astype(np.float32)),
        "length": torch.from_numpy(length.astype(np.float32)), **_wrong_values(ds), **_tasks(ds),
    }


def position_batch(ds, feats: PathFeatures, positions=None) -> dict:
    """One row per (path, position) that the features hold (a path is alive at every
    stored position), optionally only the `positions` listed (generated tokens; None:
    every stored position), in path order then position order. Keys as `tensors_at`, with
    "prefix_len" / "remaining" per row, plus "position" (B,) int64 and "path" (B,) int64,
    the row of `ds`."""
    _check_join(ds, feats)
    sel = np.arange(len(feats.positions)) if positions is None else \
        np.nonzero(np.isin(feats.positions, np.asarray(list(positions), dtype=np.int64)))[0]
    rows, pos = feats.rows[sel], feats.positions[sel]
    length = np.asarray(ds["length"][:]).astype(np.int64)
    correct = np.asarray(ds["correct"][:]).astype(np.float32)
    reward = bank.rewards_of(ds)
    hidden = np.ascontiguousarray(feats.hidden[sel], dtype=np.float32)
    signals = _signals(ds, rows, pos, hidden, feats.attn[sel], feats)
    mc = _mc(ds, feats, rows, pos, reward, np.ones(len(sel), bool))
    return {
        "hidden": torch.from_numpy(hidden), "signals": signals,
        "group": torch.from_numpy(_groups(ds)[rows]),
        "correct": torch.from_numpy(correct[rows]), "reward": torch.from_numpy(reward[rows]),
        "mc": torch.from_numpy(mc),
        "alive": torch.ones(len(sel), dtype=torch.bool),
        "prefix_len": torch.from_numpy(pos.astype(np.float32)),
        "remaining": torch.from_numpy((length[rows] - pos).astype(np.float32)),
        "length": torch.from_numpy(length[rows].astype(np.float32)),
        "position": torch.from_numpy(pos.astype(np.int64)),
        "path": torch.from_numpy(rows.astype(np.int64)), **_wrong_values(ds, rows),
        **_tasks(ds, rows),
    }


def _signals(ds, rows, prefix: np.ndarray, hidden: np.ndarray, attn: np.ndarray,
             feats: PathFeatures, chunk: int = 16384) -> torch.Tensor:
    """signal_matrix of the prefixes: confidence columns from the bank's per-token arrays
    (prefix = position), hidden statistics and attention entropy from the features."""
    if not len(prefix):
        return torch.zeros((0, len(SIGNAL_NAMES)))
    arrays = _token_arrays(ds)
    rows = np.arange(len(prefix)) if rows is None else rows
    tapped = bool(feats.meta.get("attention_heads"))
    parts = []
    for lo in range(0, len(prefix), chunk):  # (rows, T) token arrays a chunk at a time
        at = slice(lo, lo + chunk)
        lp, ent, conf = (a[torch.from_numpy(rows[at])] for a in arrays)
        parts.append(signal_matrix(lp, ent, conf, torch.from_numpy(prefix[at].astype(np.int64)),
                                   feats.meta["group_window"], torch.from_numpy(hidden[at]),
                                   torch.from_numpy(attn[at]) if tapped else None))
    return torch.cat(parts)


def load_split(features: FeatureSet, split: str, overrides: list[str] | None = None):
    """A bank split and its features, joined row for row: (ds, feats) (`require_features`:
    a missing one names the command that makes it)."""
    out = require_features(features, overrides)
    return bank.load_bank(features.bank.root, split), load_features(out, split, repair_text(overrides))
