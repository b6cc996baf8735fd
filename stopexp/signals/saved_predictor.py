"""Predictor checkpoints: safetensors weights + a JSON with the predictor config, the
feature spec it was trained for, the trace bank's hash, its validation metrics and the
size and SHA-256 of the weights file, and the key it was saved under. Loading one for
other features (model, hidden size, tap layers, signals), or one put under another key
(another config's checkpoint), or one of another predictor config (another type: mlp where
the config says linear), is refused with a message naming the file and the field that differs;
a missing, truncated or garbled file is named with the way to rebuild it. The JSON also
records what the predictor learned from (`trained_on`: fingerprints of the trace bank and
features it read); one trained on other data than the artifacts now under its key (a bank
re-collected, features re-made) is refused as stale (CheckpointStale)."""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from stopexp.core.added_keys import PREDICTOR_KEYS_ADDED
from stopexp.core.errors import UserError, error_text, writing
from stopexp.runtime.artifacts import plain, publish_dir, staging_dir, write_json
from stopexp.runtime.integrity import file_problem, file_record, records_problem
from stopexp.signals import FeatureSpec, build_predictor

WEIGHTS, META = "predictor.safetensors", "predictor.json"
REBUILD = ("rerun python -m stopexp.train with the same overrides as this run (train replaces "
           "a damaged or mismatched checkpoint of its own config), or delete {dir}")


class CheckpointMismatch(UserError, ValueError):
    """A predictor checkpoint made for other features than the ones at hand."""


class CheckpointStale(CheckpointMismatch):
    """A predictor checkpoint trained on other data than the artifacts now under its key."""

    def __init__(self, message: str, why: str | None = None):
        super().__init__(message)
        self.why = why or message  # what differs, without the file and the repair


class CheckpointDamaged(UserError, ValueError):
    """A predictor checkpoint whose files are missing, truncated or garbled."""


def save_predictor(final_dir: Path, predictor, pred_cfg, spec: FeatureSpec, bank_key: str,
                   metrics: dict, extra: dict | None = None) -> Path:
    tmp = staging_dir(final_dir)
    try:
        with writing(final_dir):  # a full disk names the checkpoint, not its temporary dir
            state = {k: v.detach().contiguous() for k, v in predictor.state_dict().items()}
            save_file(state, str(tmp / WEIGHTS))
            write_json(tmp / META, {"predictor": plain(pred_cfg),
                                    "feature_spec": {**asdict(spec), "signal_names": list(spec.signal_names)},
                                    "bank_key": bank_key, "key": final_dir.name, "metrics": metrics,
                                    "weights": file_record(tmp / WEIGHTS),
                                    **(extra or {})})
            publish_dir(tmp, final_dir)  # a concurrent job that got there first wins: same config
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final_dir


def first_difference(saved: dict, want: dict) -> str | None:
    """The first field of `want` whose value `saved` does not record, or None."""
    return next((field for field, value in want.items() if saved.get(field) != value), None)


def check_spec(saved: dict, spec: FeatureSpec, where: Path) -> None:
    want = {**asdict(spec), "signal_names": list(spec.signal_names)}
    field = first_difference(saved, want)
    if field is not None:
        raise CheckpointMismatch(
            f"predictor checkpoint {where} was trained for {field}={saved.get(field)!r}, "
            f"but the features at hand have {field}={want[field]!r}; " + REBUILD.format(dir=where))


def check_saved_predictor(saved: dict, pred_cfg, where: Path) -> None:
    """Refuse (CheckpointMismatch) a checkpoint whose META records another predictor config
    than `pred_cfg` (another type, width, layer, ...), naming the file and the first field:
    the key alone does not prove it (a copied checkpoint with an edited key)."""
    want = json.loads(json.dumps(plain(pred_cfg)))  # lists, as META holds them
    # a checkpoint saved before a key was added was trained at its default
    field = first_difference({**PREDICTOR_KEYS_ADDED, **saved}, want)
    if field is not None:
        raise CheckpointMismatch(
            f"predictor checkpoint {where / META} records predictor.{field}="
            f"{saved.get(field)!r}, this config has predictor.{field}={want[field]!r}; "
            + REBUILD.format(dir=where))


def check_trained_on(meta: dict, current: dict | None, where: Path) -> None:
    """Refuse (CheckpointStale) a checkpoint whose `trained_on` differs from `current`
    ({artifact: fingerprint} of the artifacts at hand; None: one not there now, not compared),
    or that records none (its data cannot be told)."""
    if current is None:
        return
    saved, why = meta.get("trained_on"), None
    if not isinstance(saved, dict):
        why = ("records no fingerprint of the data it was trained on (saved by an older "
               "version), so it may be another bank's")
    else:
        name = next((n for n, f in current.items() if f is not None and saved.get(n) != f), None)
        if name is not None:
            why = (f"was trained on another {name} than the one now under its key (fingerprint "
                   f"{saved.get(name)}, now {current[name]}: re-collected or re-made since)")
    if why:
        raise CheckpointStale(f"predictor checkpoint {Path(where) / META} {why}; "
                              + REBUILD.format(dir=where), why)


def meta_problem(meta) -> str | None:
    """Why META read back is not one that `save_predictor` writes (edited, or garbled into
    valid JSON), or None: the predictor config and the feature spec are objects, the weights'
    record a size and SHA-256."""
    if not isinstance(meta, dict):
        return f"it is {type(meta).__name__}, an object expected"
    for field in ("predictor", "feature_spec"):
        if not isinstance(meta.get(field), dict):
            return f"it records {field}={meta.get(field)!r}, an object expected"
    if "weights" in meta:
        return records_problem({WEIGHTS: meta["weights"]})
    return None


def read_checkpoint(ckpt_dir: Path, pred_cfg) -> dict:
    """The checkpoint's metadata, its weights file checked against the recorded size and
    SHA-256 (checkpoints saved without a record: only that the file is there). Raises
    CheckpointDamaged naming the file and how to rebuild it, CheckpointMismatch when it
    records another key than the directory it is in (a checkpoint that records no key: not
    checked) or another predictor config than `pred_cfg`."""
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / META
    try:
        meta = json.loads(path.read_text())
        problem = meta_problem(meta)
        if problem:
            raise ValueError(problem)
    except (OSError, ValueError) as e:
        raise CheckpointDamaged(f"predictor checkpoint file {path} is missing, unreadable or malformed "
                                f"({error_text(e, 120)}); " + REBUILD.format(dir=ckpt_dir)) from e
    if meta.get("key", ckpt_dir.name) != ckpt_dir.name:
        raise CheckpointMismatch(f"predictor checkpoint {ckpt_dir} does not fit this config: its "
                                 f"{META} records key={meta['key']!r}, this config expects "
                                 f"{ckpt_dir.name!r} (another config's checkpoint put in its "
                                 "place); " + REBUILD.format(dir=ckpt_dir))
    check_saved_predictor(meta["predictor"], pred_cfg, ckpt_dir)
    problem = (file_problem(ckpt_dir / WEIGHTS, meta["weights"]) if "weights" in meta
               else None if (ckpt_dir / WEIGHTS).is_file() else f"{WEIGHTS} is missing")
    if problem:
        raise CheckpointDamaged(f"predictor checkpoint {ckpt_dir}: {problem}; "
                                + REBUILD.format(dir=ckpt_dir))
    return meta


def load_weights(ckpt_dir: Path, device: str = "cpu") -> dict:
    """The state dict in WEIGHTS; a file that safetensors cannot read is named."""
    path = Path(ckpt_dir) / WEIGHTS
    try:
        return load_file(str(path), device=device)
    except Exception as e:  # SafetensorError, OSError: neither names the file
        raise CheckpointDamaged(f"predictor checkpoint file {path} cannot be read "
                                f"({error_text(e, 120)}); " + REBUILD.format(dir=Path(ckpt_dir))) from e


def load_predictor(ckpt_dir: Path, spec: FeatureSpec, pred_cfg, trained_on: dict | None = None):
    """(predictor in eval mode, metadata); refuses a checkpoint for other features or of
    another predictor config than `pred_cfg` (CheckpointMismatch), one trained on other data
    than `trained_on` (CheckpointStale: `check_trained_on`) and a damaged one
    (CheckpointDamaged), naming the file."""
    ckpt_dir = Path(ckpt_dir)
    meta = read_checkpoint(ckpt_dir, pred_cfg)
    check_trained_on(meta, trained_on, ckpt_dir)
    saved = meta["feature_spec"]
    check_spec(saved, spec, ckpt_dir)
    spec = FeatureSpec(saved["model_name"], saved["hidden_size"], list(saved["tap_layers"]),
                       tuple(saved["signal_names"]))
    predictor = build_predictor(OmegaConf.create(meta["predictor"]), spec)
    try:
        predictor.load_state_dict(load_weights(ckpt_dir))
    except RuntimeError as e:  # other tensor names or shapes than its own config builds
        raise CheckpointDamaged(f"predictor checkpoint {ckpt_dir / WEIGHTS} does not fit its "
                                f"{META} ({error_text(e, 160)}); " + REBUILD.format(dir=ckpt_dir)) from e
    return predictor.eval(), meta
