"""A damaged or stale predictor checkpoint, toy LM or sweep job file is named and never
loaded; the stage that owns it (train, the toy LM's cache) rebuilds it."""
import json
import os
import shutil

import pytest

from conftest import compose, featurized
from stopexp.config import validate
from stopexp.signals.saved_predictor import CheckpointDamaged, CheckpointMismatch, load_predictor
from stopexp.stages import build
from stopexp.stages.build import predictor_dir
from stopexp.stages.train import train_with_controls
from stopexp.store import bank


def test_damaged_predictor_is_named_and_train_rebuilds_it(copied, small_bank):
    from stopexp.stages.scorers import build_scorers
    from stopexp.store.feature_sets import spec_of

    _, root = copied
    cfg = validate(compose("train", [*small_bank, f"paths.output_dir={root.parents[2]}",
                                     "predictor=linear", "train.epochs=2"]))
    first = train_with_controls(featurized(cfg), progress=False)
    ckpt = predictor_dir(cfg, build.feature_set(cfg))
    weights = (ckpt / "predictor.safetensors").read_bytes()
    spec = spec_of(cfg.tap.layers, bank.read_meta(root))
    os.truncate(ckpt / "predictor.safetensors", 100)
    with pytest.raises(CheckpointDamaged, match=rf"{ckpt}: predictor.safetensors has 100 bytes, "
                                                rf"{len(weights)} recorded.*python -m stopexp.train"):
        load_predictor(ckpt, spec, cfg.predictor)
    with pytest.raises(CheckpointDamaged, match=r"; rebuild it with: python -m stopexp.train"):
        build_scorers(cfg, ["linear"], spec, build.feature_set(cfg))
    assert train_with_controls(cfg, progress=False)["val"] == first["val"]  # rebuilt, not refused
    assert (ckpt / "predictor.safetensors").read_bytes() == weights
    other = validate(compose("train", [*small_bank, f"paths.output_dir={root.parents[2]}",
                                       "predictor=linear", "train.epochs=2", "train.seed=7"]))
    train_with_controls(other, progress=False)  # the same features and spec, another config
    for damage in ("truncate_json", "drop_json", "other_features", "other_config"):
        meta_path = ckpt / "predictor.json"
        meta = json.loads(meta_path.read_text())
        if damage == "truncate_json":
            meta_path.write_text(meta_path.read_text()[:50])
            with pytest.raises(CheckpointDamaged, match=f"file {meta_path} is missing, unreadable or malformed"):
                load_predictor(ckpt, spec, cfg.predictor)
        elif damage == "drop_json":  # retrained in its place, once
            meta_path.unlink()
        elif damage == "other_features":  # refused with its repair, which train then carries out
            meta["feature_spec"]["hidden_size"] = 64
            meta_path.write_text(json.dumps(meta))
            with pytest.raises(CheckpointMismatch, match="hidden_size=64.*python -m stopexp.train"):
                load_predictor(ckpt, spec, cfg.predictor)
        else:  # another config's checkpoint of the same spec: refused by its key
            shutil.rmtree(ckpt)
            shutil.copytree(predictor_dir(other, build.feature_set(other)), ckpt)
            with pytest.raises(CheckpointMismatch, match=rf"^predictor checkpoint {ckpt} does not fit "
                                                         rf"this config: its predictor.json records "
                                                         rf"key='{predictor_dir(other, build.feature_set(other)).name}', this "
                                                         rf"config expects '{ckpt.name}'"):
                load_predictor(ckpt, spec, cfg.predictor)
            with pytest.raises(CheckpointMismatch, match=r"; rebuild it with: python -m stopexp.train"):
                build_scorers(cfg, ["linear"], spec, build.feature_set(cfg))
        assert train_with_controls(cfg, progress=False)["val"] == first["val"]
        predictor, saved = load_predictor(ckpt, spec, cfg.predictor)
        assert saved["weights"]["size"] == len(weights)
        assert (ckpt / "predictor.safetensors").read_bytes() == weights


def test_super_token_checkpoint_damage_is_named(tmp_path):
    from stopexp.models.super_token import checkpoint_meta
    from stopexp.signals.saved_predictor import load_weights
    from stopexp.signals.feature_spec import FeatureSpec

    (tmp_path / "predictor.json").write_text('{"predictor": {"name": "super_token"}, "feat')
    spec = FeatureSpec("toy", 96, [2], ("a",))
    with pytest.raises(CheckpointDamaged, match=f"{tmp_path / 'predictor.json'} is missing, unreadable or malformed"):
        checkpoint_meta(tmp_path, spec, compose("train", ["predictor=super_token"]).predictor)
    (tmp_path / "predictor.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")
    with pytest.raises(CheckpointDamaged, match=f"file {tmp_path / 'predictor.safetensors'} cannot be read"):
        load_weights(tmp_path)


def test_damaged_toy_lm_is_named_and_never_loaded(tmp_path, caplog):
    from stopexp.models.toy_lm import COMMITTED, ensure_toy_lm, toy_key, toy_lm_problem

    cfg = compose("collect", [f"paths.output_dir={tmp_path}"])
    key = toy_key(cfg.model.toy, cfg.task)
    committed = COMMITTED / f"toy-{key}"
    assert toy_lm_problem(committed) is None
    cached = tmp_path / "cache" / "toy_lm" / key
    shutil.copytree(committed, cached)
    assert ensure_toy_lm(cfg.model.toy, cfg.task, cfg.paths.cache_dir) == cached
    size = (cached / "model.safetensors").stat().st_size
    os.truncate(cached / "model.safetensors", 1000)
    assert toy_lm_problem(cached) == (f"model.safetensors has 1000 bytes, {size} recorded "
                                      "(truncated or replaced)")
    with caplog.at_level("WARNING"):
        assert ensure_toy_lm(cfg.model.toy, cfg.task, cfg.paths.cache_dir) == committed  # the damaged copy is deleted, the committed one used
    assert "cached toy LM" in caplog.text and "model.safetensors has 1000 bytes" in caplog.text
    assert not cached.exists() and [p.name for p in cached.parent.iterdir()] == [f".{key}.lock"]
    # a toy_lm.json without the files' record: the weights' header must cover the file
    shutil.copytree(committed, cached)
    info = json.loads((cached / "toy_lm.json").read_text())
    del info["files"]
    (cached / "toy_lm.json").write_text(json.dumps(info))
    assert toy_lm_problem(cached) is None
    os.truncate(cached / "model.safetensors", 1000)
    assert toy_lm_problem(cached).startswith(
        "model.safetensors cannot be read (Error while deserializing header")


def test_a_damaged_job_file_of_a_sweep_is_named(tmp_path):
    from omegaconf import OmegaConf

    from stopexp.runtime import sweeps

    job = tmp_path / "sweep" / "0"
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose("pipeline"), job / ".hydra" / "config.yaml")
    (job / "metrics.json").write_text('{"methods": {"no_pr')
    with pytest.raises(ValueError, match=rf"job {job}: metrics.json or .hydra/config.yaml is "
                                         r"unreadable \(JSONDecodeError.*or delete"):
        sweeps.dir_runs(job.parent)


@pytest.mark.parametrize("meta, why", [
    ([], "it is list, an object expected"),
    ({"predictor": {"name": "mlp"}, "feature_spec": 7}, "it records feature_spec=7, an object expected"),
    ({"predictor": "mlp", "feature_spec": {}}, "it records predictor='mlp', an object expected"),
    ({"predictor": {"name": "mlp"}, "feature_spec": {}, "weights": {"size": "many"}},
     "its record of predictor.safetensors is {'size': 'many'}, not a size and SHA-256"),
])
def test_checkpoint_metadata_of_another_shape_is_damage(tmp_path, meta, why):
    from stopexp.signals.saved_predictor import read_checkpoint

    (tmp_path / "predictor.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointDamaged) as e:
        read_checkpoint(tmp_path, compose("train", []).predictor)
    assert str(e.value).startswith(f"predictor checkpoint file {tmp_path / 'predictor.json'} is missing, unreadable "
                                   f"or malformed (ValueError: {why}); rerun python -m stopexp.train")
