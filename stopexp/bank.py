"""The trace bank: every collected path with its checkpoint features and labels.

An HF `datasets` Arrow store with explicit features (fixed-shape float32 arrays), written
in shards. Each shard is saved under a temporary name and renamed into place, so a crash
never leaves half a shard; a rerun skips the shards already there. Shard names carry the
rank of the process that wrote them, and loading sorts them, so the order of paths is
the same whichever process wrote what.

The bank lives in `<cache>/traces/<hash>`, where the hash covers every config section that
changes its content; `meta.json` records what a consumer needs to check it fits.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from datasets import Array2D, Array3D, Dataset, Features, List, Value, concatenate_datasets
from datasets import load_from_disk
from datasets.utils.logging import disable_progress_bar

from stopexp.artifacts import config_hash, plain, publish_dir, staging_dir, write_json
from stopexp.config import checkpoint_tokens
from stopexp.signals.features import SIGNAL_NAMES

disable_progress_bar()  # one bar per shard save would drown the collect progress bar

BANK_VERSION = 1
EMPTY = "empty-shard.json"


class BankMissing(FileNotFoundError):
    """No trace bank for this config; the message gives the command that makes it."""


def checkpoints_of(cfg) -> list[int]:
    return sorted({checkpoint_tokens(c, cfg.search.max_new_tokens) for c in cfg.tap.checkpoints})


def sampling_section(search) -> dict:
    keys = ("n_paths", "max_new_tokens", "temperature", "top_p", "top_k", "do_sample",
            "conf_topk", "group_window", "stop")
    out = {k: search[k] for k in keys}
    out["stop"] = list(out["stop"])  # stop strings change the paths' content
    return out


def bank_key(cfg) -> str:
    """What the bank's content depends on (not batch sizes, the rank that wrote a shard,
    loggers or later stages)."""
    model = {k: v for k, v in plain(cfg.model).items() if k != "max_batch_tokens"}
    if model.get("long_prompts", "error") == "error":  # refusing changes no bank's content
        model.pop("long_prompts", None)
        model.pop("max_prompt_tokens", None)
    collect = {k: v for k, v in plain(cfg.collect).items() if k not in ("rank", "world")}
    return config_hash({"version": BANK_VERSION, "model": model, "task": cfg.task,
                        "tap": {"layers": list(cfg.tap.layers), "pooling": cfg.tap.pooling,
                                "checkpoints": checkpoints_of(cfg)},
                        "search": sampling_section(cfg.search), "collect": collect,
                        "seed": cfg.seed})


def bank_dir(cfg) -> Path:
    return Path(cfg.paths.cache_dir) / "traces" / bank_key(cfg)


def features(n_checkpoints: int, n_layers: int, hidden: int) -> Features:
    f32 = Value("float32")
    return Features({
        "split": Value("string"), "prompt_id": Value("int32"), "prompt": Value("string"),
        "path_id": Value("int32"), "tokens": List(Value("int32")), "text": Value("string"),
        "answer": Value("string"), "correct": Value("bool"), "length": Value("int32"),
        "finished": Value("bool"), "style": Value("string"), "first_error": Value("int32"),
        "token_logprob": List(f32), "token_entropy": List(f32), "token_conf": List(f32),
        "alive": List(Value("bool"), length=n_checkpoints),
        "mc": List(f32, length=n_checkpoints),
        "signals": Array2D(shape=(n_checkpoints, len(SIGNAL_NAMES)), dtype="float32"),
        "hidden": Array3D(shape=(n_checkpoints, n_layers, hidden), dtype="float32"),
    })


def shard_name(index: int, rank: int = 0) -> str:
    """Shards sort by their index in the collection plan, whichever rank wrote them."""
    return f"shard-{index:05d}-r{rank:03d}"


def shard_index(name: str) -> int:
    return int(name.split("-")[1])


def write_shard(root: Path, name: str, rows: dict, feats: Features) -> None:
    """Save one shard atomically (temp dir + rename)."""
    final = root / name
    tmp = staging_dir(final)
    try:
        if rows["length"]:
            Dataset.from_dict(rows, features=feats).save_to_disk(str(tmp))
        else:  # every prompt filtered out: the shard is done but holds nothing
            (tmp / EMPTY).write_text("{}")
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def finished_shards(root: Path) -> set[str]:
    """Names of the shards fully written (temporary dirs start with a dot)."""
    return {p.name for p in root.glob("shard-*")
            if (p / "dataset_info.json").exists() or (p / EMPTY).exists()}


def write_meta(root: Path, meta: dict) -> None:
    write_json(root / "meta.json", meta)


def read_meta(root: Path) -> dict:
    return json.loads((root / "meta.json").read_text())


def load_bank(root: Path, split: str | None = None) -> Dataset:
    """All finished shards (sorted by name), optionally one split, numpy-formatted."""
    names = sorted(n for n in finished_shards(root) if not (root / n / EMPTY).exists())
    if not names:
        raise BankMissing(f"trace bank {root} holds no finished shard")
    ds = concatenate_datasets([load_from_disk(str(root / n)) for n in names])
    if split is not None:
        idx = np.nonzero(np.asarray(ds["split"][:]) == split)[0]
        ds = ds.select(idx)
    return ds.with_format("numpy")


def require_bank(cfg, overrides: list[str] | None = None) -> Path:
    """The bank for this config, or an error that prints the exact collect command."""
    root = bank_dir(cfg)
    if (root / "meta.json").exists() and read_meta(root).get("complete"):
        return root
    args = " ".join(overrides or [])
    raise BankMissing(f"no complete trace bank for this config at {root}.\n"
                      f"Make it with:  python -m stopexp.collect {args}".rstrip()
                      + "\n(or run python -m stopexp.pipeline, which makes it for you)")


def tensors_at(ds: Dataset, c_idx: int, checkpoint: int) -> dict:
    """Everything a predictor or a pruning decision needs at checkpoint `c_idx`, for every
    path of `ds` (numpy-formatted bank), as float32/int64 torch tensors."""
    import torch

    splits, prompt_ids = np.asarray(ds["split"][:]), np.asarray(ds["prompt_id"][:])
    keys = np.char.add(np.char.add(splits.astype(str), "/"), prompt_ids.astype(str))
    _, group = np.unique(keys, return_inverse=True)
    length = np.asarray(ds["length"][:]).astype(np.float32)
    signals = ds["signals"][:][:, c_idx]
    prefix = signals[:, SIGNAL_NAMES.index("prefix_len")]
    return {
        "hidden": torch.from_numpy(np.ascontiguousarray(ds["hidden"][:][:, c_idx])),
        "signals": torch.from_numpy(np.ascontiguousarray(signals)),
        "group": torch.from_numpy(group.astype(np.int64)),
        "correct": torch.from_numpy(np.asarray(ds["correct"][:]).astype(np.float32)),
        "mc": torch.from_numpy(ds["mc"][:][:, c_idx].astype(np.float32)),
        "alive": torch.from_numpy(ds["alive"][:][:, c_idx].astype(bool)),
        "prefix_len": torch.from_numpy(prefix.astype(np.float32)),
        "remaining": torch.from_numpy(np.maximum(length - checkpoint, 0)),
        "length": torch.from_numpy(length),
    }


def prefix_columns(ds: Dataset) -> dict:
    """Each path's prompt and generated ids, for predictors that re-encode the prefix (the
    super token); object arrays, so `select_rows` indexes them like the tensors."""
    tokens = np.empty(len(ds), dtype=object)
    tokens[:] = [np.asarray(t) for t in ds["tokens"][:]]
    return {"prompt": np.asarray(ds["prompt"][:], dtype=object), "tokens": tokens}


def select_rows(batch: dict, rows) -> dict:
    return {k: v[rows] for k, v in batch.items()}
