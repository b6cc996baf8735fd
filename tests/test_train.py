import json

import numpy as np
import pytest

from conftest import compose
from stopexp import bank
from stopexp.config import validate
from stopexp.signals.checkpoint import CheckpointMismatch, load_predictor
from stopexp.train import feature_spec, predictor_dir, score, split_data, train


def cfg_for(small_bank, *extra, stage="train"):
    return validate(compose(stage, [*small_bank, "train.epochs=3", *extra]))


def test_train_writes_a_checkpoint_that_reloads_with_identical_scores(small_bank, tmp_path):
    import shutil

    cfg = cfg_for(small_bank)
    shutil.rmtree(predictor_dir(cfg), ignore_errors=True)  # other tests may have made it
    metrics = train(cfg, run_dir=tmp_path, progress=False)
    assert {"train", "val", "test"} <= set(metrics)
    for split in ("train", "val", "test"):
        m = metrics[split]
        assert 0 <= m["auroc_pooled"] <= 1 and 0 <= m["brier"] <= 1 and 0 <= m["ece"] <= 1
    assert metrics["parameters"] == 96 * 2 + 96 * 128 + 128 + 128 + 1
    assert (tmp_path / "loss_curve.png").exists() and (tmp_path / "reliability.png").exists()
    root = bank.require_bank(cfg)
    meta = bank.read_meta(root)
    predictor, saved = load_predictor(predictor_dir(cfg), feature_spec(meta))
    assert saved["bank_key"] == root.name and saved["feature_spec"]["hidden_size"] == 96
    data = split_data(root, meta, cfg)
    again = score(predictor, data["test"])
    assert np.isclose(json.loads((predictor_dir(cfg) / "predictor.json").read_text())
                      ["metrics"]["test"]["auroc_pooled"], metrics["test"]["auroc_pooled"])
    from stopexp.train import evaluate_scores
    assert evaluate_scores(again, data["test"])["auroc_pooled"] == metrics["test"]["auroc_pooled"]
    # a second call finds the checkpoint instead of retraining
    assert train(cfg, progress=False)["checkpoint"] == metrics["checkpoint"]


def test_checkpoint_for_other_features_is_refused(small_bank):
    cfg = cfg_for(small_bank, "predictor=linear")
    train(cfg, progress=False)
    meta = bank.read_meta(bank.require_bank(cfg))
    spec = feature_spec(meta)
    for field, value in (("hidden_size", 64), ("tap_layers", [0]), ("model_name", "llama")):
        other = type(spec)(**{**spec.__dict__, field: value})
        with pytest.raises(CheckpointMismatch, match=field):
            load_predictor(predictor_dir(cfg), other)


def test_splits_share_no_prompt(small_bank):
    cfg = cfg_for(small_bank)
    root = bank.require_bank(cfg)
    data = split_data(root, bank.read_meta(root), cfg)
    prompts = {}
    ds = bank.load_bank(root)
    for split in ("train", "val", "test"):
        prompts[split] = set(ds["prompt"][:][ds["split"][:] == split])
    assert not (prompts["train"] & prompts["val"]) and not (prompts["train"] & prompts["test"])
    assert not (prompts["val"] & prompts["test"])
    assert bool(data["train"]["alive"].all())


def test_statistic_and_controls_run_through_the_same_path(small_bank):
    for pred in ("statistic", "conf_features", "fusion"):
        extra = ["tap=multi"] if pred == "fusion" else []
        if extra:
            with pytest.raises(bank.BankMissing, match="python -m stopexp.collect"):
                train(cfg_for(small_bank, f"predictor={pred}", *extra), progress=False)
            continue
        m = train(cfg_for(small_bank, f"predictor={pred}"), progress=False)
        assert np.isfinite(m["val"]["auroc_pooled"])


def test_training_is_seeded(small_bank):
    import shutil

    cfg = cfg_for(small_bank, "loss=reward_regression")
    first = train(cfg, progress=False)
    ckpt = predictor_dir(cfg)
    weights = (ckpt / "predictor.safetensors").read_bytes()
    shutil.rmtree(ckpt)
    again = train(cfg, progress=False)
    assert (ckpt / "predictor.safetensors").read_bytes() == weights
    assert again["val"] == first["val"]
