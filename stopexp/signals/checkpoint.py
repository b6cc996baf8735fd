"""Predictor checkpoints: safetensors weights + a JSON with the predictor config, the
feature spec it was trained for, the trace bank's hash and its validation metrics.
Loading one for other features (model, hidden size, tap layers, signals) is refused
with a message naming the field that differs."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from stopexp.artifacts import publish_dir, staging_dir, write_json
from stopexp.signals import FeatureSpec, build_predictor

WEIGHTS, META = "predictor.safetensors", "predictor.json"


class CheckpointMismatch(ValueError):
    """A predictor checkpoint made for other features than the ones at hand."""


def save_predictor(final_dir: Path, predictor, pred_cfg, spec: FeatureSpec, bank_key: str,
                   metrics: dict, extra: dict | None = None) -> Path:
    tmp = staging_dir(final_dir)
    state = {k: v.detach().contiguous() for k, v in predictor.state_dict().items()}
    save_file(state, str(tmp / WEIGHTS))
    write_json(tmp / META, {"predictor": OmegaConf.to_container(pred_cfg) if OmegaConf.is_config(pred_cfg) else dict(pred_cfg),
                            "feature_spec": {**asdict(spec), "signal_names": list(spec.signal_names)},
                            "bank_key": bank_key, "metrics": metrics, **(extra or {})})
    publish_dir(tmp, final_dir)  # a concurrent job that got there first wins: same config
    return final_dir


def check_spec(saved: dict, spec: FeatureSpec, where: Path) -> None:
    want = {**asdict(spec), "signal_names": list(spec.signal_names)}
    for field, value in want.items():
        if saved.get(field) != value:
            raise CheckpointMismatch(
                f"predictor checkpoint {where} was trained for {field}={saved.get(field)!r}, "
                f"but the features at hand have {field}={value!r}; retrain it "
                "(python -m stopexp.train with this config)")


def load_predictor(ckpt_dir: Path, spec: FeatureSpec | None = None):
    """(predictor in eval mode, metadata); refuses a checkpoint for other features."""
    ckpt_dir = Path(ckpt_dir)
    meta = json.loads((ckpt_dir / META).read_text())
    saved = meta["feature_spec"]
    if spec is not None:
        check_spec(saved, spec, ckpt_dir)
    spec = FeatureSpec(saved["model_name"], saved["hidden_size"], list(saved["tap_layers"]),
                       tuple(saved["signal_names"]))
    predictor = build_predictor(OmegaConf.create(meta["predictor"]), spec)
    predictor.load_state_dict(load_file(str(ckpt_dir / WEIGHTS)))
    return predictor.eval(), meta
