import json

import numpy as np
import pytest

from conftest import compose, featurized
from stopexp.config import ConfigError, validate
from stopexp.signals.saved_predictor import CheckpointMismatch, load_predictor
from stopexp.stages.build import predictor_dir, training_data
from stopexp.stages.train import train
from stopexp.store import bank
from stopexp.store.feature_sets import spec_of
from stopexp.training.fit import score
from stopexp.stages import build


def cfg_for(small_bank, *extra, stage="train"):
    return validate(compose(stage, [*small_bank, "train.epochs=${stopexp_where_read:train.epochs,3}", *extra]))


def test_train_writes_a_checkpoint_that_reloads_with_identical_scores(small_bank, tmp_path):
    import shutil

    cfg = cfg_for(small_bank)
    shutil.rmtree(predictor_dir(cfg, build.feature_set(cfg)), ignore_errors=True)  # other tests may have made it
    metrics = train(cfg, run_dir=tmp_path, progress=False)
    assert {"train", "val", "test"} <= set(metrics)
    for split in ("train", "val", "test"):
        m = metrics[split]
        assert 0 <= m["auroc_pooled"] <= 1 and 0 <= m["brier"] <= 1 and 0 <= m["ece"] <= 1
    assert metrics["parameters"] == 96 * 2 + 96 * 128 + 128 + 128 + 1
    assert (tmp_path / "loss_curve.png").exists() and (tmp_path / "reliability.png").exists()
    root = bank.require_bank(build.bank(cfg))
    meta = bank.read_meta(root)
    predictor, saved = load_predictor(predictor_dir(cfg, build.feature_set(cfg)), spec_of(cfg.tap.layers, meta), cfg.predictor)
    assert saved["bank_key"] == root.name and saved["feature_spec"]["hidden_size"] == 96
    data = training_data(cfg, build.feature_set(cfg), meta)
    again = score(predictor, data["test"])
    assert np.isclose(json.loads((predictor_dir(cfg, build.feature_set(cfg)) / "predictor.json").read_text())
                      ["metrics"]["test"]["auroc_pooled"], metrics["test"]["auroc_pooled"])
    from stopexp.training.fit import evaluate_scores
    assert evaluate_scores(again, data["test"])["auroc_pooled"] == metrics["test"]["auroc_pooled"]
    # a second call finds the checkpoint instead of retraining
    assert train(cfg, progress=False)["checkpoint"] == metrics["checkpoint"]


def test_checkpoint_for_other_features_is_refused(small_bank):
    cfg = cfg_for(small_bank, "predictor=linear")
    train(cfg, progress=False)
    meta = bank.read_meta(bank.require_bank(build.bank(cfg)))
    spec = spec_of(cfg.tap.layers, meta)
    for field, value in (("hidden_size", 64), ("tap_layers", [0]), ("model_name", "llama")):
        other = type(spec)(**{**spec.__dict__, field: value})
        with pytest.raises(CheckpointMismatch, match=field):
            load_predictor(predictor_dir(cfg, build.feature_set(cfg)), other, cfg.predictor)


def test_a_checkpoint_of_another_predictor_config_is_refused_on_every_load(small_bank):
    import shutil

    from stopexp.stages.scorers import build_scorers

    seed = "train.seed=23"  # no other test trains these: the copies below harm nobody
    linear, mlp = cfg_for(small_bank, "predictor=linear", seed), cfg_for(small_bank, "predictor=mlp", seed)
    first = train(linear, progress=False)
    train(mlp, progress=False)
    ckpt, spec = predictor_dir(linear, build.feature_set(linear)), spec_of(linear.tap.layers, bank.read_meta(bank.require_bank(build.bank(linear))))
    record = ckpt / "predictor.json"
    weights = (ckpt / "predictor.safetensors").read_bytes()
    # the mlp's checkpoint under the linear key, its record's key edited to match
    shutil.rmtree(ckpt)
    shutil.copytree(predictor_dir(mlp, build.feature_set(mlp)), ckpt)
    record.write_text(json.dumps({**json.loads(record.read_text()), "key": ckpt.name}))
    want = (f"^predictor checkpoint {record} records predictor.name='mlp', this config has "
            "predictor.name='linear'; rerun python -m stopexp.train")
    with pytest.raises(CheckpointMismatch, match=want):  # not loaded as the linear probe
        load_predictor(ckpt, spec, linear.predictor)
    with pytest.raises(CheckpointMismatch, match=want + r".*; rebuild it with: python -m stopexp.train"):
        build_scorers(linear, ["linear"], spec, build.feature_set(linear))  # evaluate
    assert train(linear, progress=False)["val"] == first["val"]  # train's cache: retrained
    assert (ckpt / "predictor.safetensors").read_bytes() == weights
    # a setting that changes no tensor shape, so only the record tells
    meta = json.loads(record.read_text())
    meta["predictor"]["dropout"] = 0.5
    record.write_text(json.dumps(meta))
    with pytest.raises(CheckpointMismatch, match=f"{record} records predictor.dropout=0.5, this config "
                                                 "has predictor.dropout=0.0"):
        load_predictor(ckpt, spec, linear.predictor)


def test_splits_share_no_prompt(small_bank):
    cfg = cfg_for(small_bank)
    root = bank.require_bank(build.bank(cfg))
    data = training_data(cfg, build.feature_set(cfg), bank.read_meta(root))
    prompts = {}
    ds = bank.load_bank(root)
    for split in ("train", "val", "test"):
        prompts[split] = set(ds["prompt"][:][ds["split"][:] == split])
    assert not (prompts["train"] & prompts["val"]) and not (prompts["train"] & prompts["test"])
    assert not (prompts["val"] & prompts["test"])
    assert bool(data["train"]["alive"].all())


def test_statistic_and_controls_run_through_the_same_path(small_bank):
    for pred in ("statistic", "conf_features", "fusion"):
        extra = ["tap=multi"] if pred == "fusion" else []  # another tap: new features, same bank
        cfg = featurized(cfg_for(small_bank, f"predictor={pred}", *extra))
        m = train(cfg, progress=False)
        assert np.isfinite(m["val"]["auroc_pooled"]) and build.bank(cfg).root == build.bank(cfg_for(small_bank)).root


def test_training_is_seeded(small_bank):
    import shutil

    cfg = cfg_for(small_bank, "loss=reward_regression")
    first = train(cfg, progress=False)
    ckpt = predictor_dir(cfg, build.feature_set(cfg))
    weights = (ckpt / "predictor.safetensors").read_bytes()
    shutil.rmtree(ckpt)
    again = train(cfg, progress=False)
    assert (ckpt / "predictor.safetensors").read_bytes() == weights
    assert again["val"] == first["val"]


def test_two_losses_train_different_weights_and_scores(small_bank):
    """Losses whose gradients share their signs still train different probes in a shrunk run:
    on a flat validation AUROC, keeping epoch 1 would keep one Adam step of lr *
    sign(gradient), the same for all of them, and a random initial direction would decide
    the linear probe's ranking. So ties go to the later epoch and the probe starts at zero."""
    from safetensors.torch import load_file

    root = bank.require_bank(build.bank(cfg_for(small_bank)))
    meta = bank.read_meta(root)
    weights, scores, metrics = {}, {}, {}
    for loss in ("contrastive", "pairwise", "reward_regression"):
        cfg = cfg_for(small_bank, "predictor=linear", f"loss={loss}")
        metrics[loss] = train(cfg, progress=False)
        weights[loss] = load_file(str(predictor_dir(cfg, build.feature_set(cfg)) / "predictor.safetensors"))["head.weight"]
        predictor, _ = load_predictor(predictor_dir(cfg, build.feature_set(cfg)), spec_of(cfg.tap.layers, meta), cfg.predictor)
        scores[loss] = score(predictor, training_data(cfg, build.feature_set(cfg), meta)["test"]).numpy()
    for other in ("pairwise", "reward_regression"):
        assert (weights[other] - weights["contrastive"]).abs().max() > 1e-6, other
        assert not np.allclose(scores[other], scores["contrastive"], rtol=0, atol=1e-6), other
    for m in metrics.values():
        assert m["best_epoch"] == 3  # the validation AUROC is flat here: the last epoch wins
        assert m["val_auroc_untrained"] == 0.5 and m["warnings"] == []  # zero init ties all
        assert m["val"]["auroc"] > 0.5


def test_a_fit_that_does_not_beat_its_initialisation_says_so(small_bank):
    m = train(cfg_for(small_bank, "train.lr=1e-12", "train.seed=7"), progress=False)
    assert m["val"]["auroc"] == m["val_auroc_untrained"]
    assert len(m["warnings"]) == 1 and m["warnings"][0].startswith(
        f"the selected epoch {m['best_epoch']} ranks validation paths no better than the "
        f"untrained initialisation (within-prompt AUROC {m['val_auroc_untrained']:.4f} vs "
        f"{m['val_auroc_untrained']:.4f} before training)")
    flat = cfg_for(small_bank, "train.lr=1e-12", "train.seed=7")
    saved = json.loads((predictor_dir(flat, build.feature_set(flat))
                        / "predictor.json").read_text())
    assert saved["metrics"]["warnings"] == m["warnings"]  # the checkpoint is marked


def test_nan_validation_never_selects_the_untrained_state(small_bank, monkeypatch):
    import stopexp.training.fit as T
    from stopexp.signals import build_predictor

    cfg = cfg_for(small_bank)
    root = bank.require_bank(build.bank(cfg))
    meta = bank.read_meta(root)
    data = training_data(cfg, build.feature_set(cfg), meta)
    real = T.evaluate_scores
    monkeypatch.setattr(T, "evaluate_scores", lambda s, d: {**real(s, d), "auroc": float("nan")})
    predictor = build_predictor(cfg.predictor, spec_of(cfg.tap.layers, meta))
    with pytest.raises(ValueError, match=r"^train: the validation within-prompt AUROC was not "
                                         r"finite after any of 3 epochs"):
        T.fit(predictor, data, cfg.train, cfg.loss, progress=False)


def _split(groups, correct):
    import torch

    return {"group": torch.tensor(groups), "correct": torch.tensor(correct, dtype=torch.float32)}


def test_a_split_without_mixed_prompts_is_refused():
    from stopexp.training.data import NothingToLearn, check_usable

    assert check_usable("val", _split([0, 0, 1, 1], [1, 0, 1, 1]), 5, 8) == 1
    with pytest.raises(NothingToLearn) as e:
        check_usable("val", _split([0, 0, 1, 1], [1, 1, 0, 0]), 5, 8)
    assert str(e.value) == (
        "train: the val split has no usable pair at checkpoint 5 tokens (train.checkpoint): 2 "
        "prompts with 4 paths alive there, 2 of them correct, and no prompt has both a correct "
        "and a wrong path. Training and its epoch selection compare paths of one prompt, so "
        "nothing can be learned. Collect more prompts (collect.prompts.val), give the split a "
        "larger share (task.split_fractions), keep prompts with mixed outcomes "
        "(collect.keep_correct=[1, 7]), or try another task.seed or seed.")
    with pytest.raises(NothingToLearn, match="the train split has no usable pair at checkpoint 5 "
                                             "tokens .*: 1 prompts with 3 paths alive there, 0 of"):
        check_usable("train", _split([4, 4, 4], [0, 0, 0]), 5, 8)  # zero positives
    with pytest.raises(NothingToLearn, match="the val split has no usable pair .*: 0 prompts "
                                             "with 0 paths"):
        check_usable("val", None, 5, 8)  # a split the task left empty


def test_train_refuses_a_bank_whose_val_split_has_no_mixed_prompt(small_bank, tmp_path):
    from stopexp.stages.collect import collect
    from stopexp.training.data import NothingToLearn

    # keep only the validation prompts that no path solves
    extra = [f"paths.output_dir={tmp_path}", "collect.keep_correct=[0,0]",
             "collect.keep_correct_splits=[val]"]
    collect(build.collection(compose("collect", [*small_bank, *extra])))  # validate refuses the band: bypass it
    cfg = compose("train", [*small_bank, "train.epochs=3", *extra])
    with pytest.raises(ConfigError, match=r"^collect.keep_correct: \[0, 0\] keeps only val prompts "
                                          r"whose N=8 paths all fail or all succeed"):
        validate(cfg)  # found at start-up; and if validate is skipped, train still refuses:
    featurized(cfg)
    # here no val prompt survives the band at all; with some left, none of them is mixed
    with pytest.raises(NothingToLearn, match=r"^(train: the val split has no usable pair|"
                                             r"train: the trace bank holds no val path: all 6 "
                                             r"val prompts were left out: 6 outside the "
                                             r"difficulty filter collect.keep_correct)"):
        train(cfg, progress=False)
    assert not predictor_dir(cfg, build.feature_set(cfg)).exists()  # nothing saved


def _recollect_with_other_labels(root, name):
    """Rewrite shard `name` of the bank at `root` as a re-collect that graded its paths
    otherwise would: every `correct` flipped, its record and meta.json's rewritten to match."""
    from datasets import load_from_disk

    from stopexp.runtime.integrity import set_aside

    meta = bank.read_meta(root)
    ds = load_from_disk(str(root / name))
    cols = ds.to_dict()
    cols["correct"] = [not c for c in cols["correct"]]
    cols["reward"] = [float(c) for c in cols["correct"]]
    old = meta["shards"][name]
    set_aside(root / name)
    info = {k: v for k, v in old.items() if k not in ("index", "rows", "splits", "files")}
    meta["shards"][name] = bank.write_shard(root, name, cols, ds.features, info)
    bank.write_meta(root, meta)


def test_a_predictor_of_a_bank_recollected_under_its_key_is_retrained_or_refused(small_bank, tmp_path,
                                                                                   caplog):
    import shutil

    from stopexp.core.errors import UserError
    from stopexp.stages.scorers import build_scorers
    from stopexp.signals.saved_predictor import CheckpointStale
    from stopexp.stages.featurize import featurize
    from stopexp.training.data import trained_on

    here = [f"paths.output_dir={tmp_path}", *small_bank[1:]]  # a copy of the bank: ours to change
    cfg = cfg_for(here, "predictor=linear")
    shutil.copytree(bank.require_bank(build.bank(cfg_for(small_bank))), build.bank(cfg).root)
    train(featurized(cfg), progress=False)
    record = predictor_dir(cfg, build.feature_set(cfg)) / "predictor.json"
    before = json.loads(record.read_text())["trained_on"]
    assert before == trained_on(build.feature_set(cfg)) and None not in before.values()
    root = bank.require_bank(build.bank(cfg))
    meta = bank.read_meta(root)
    name = next(n for n, rec in sorted(meta["shards"].items()) if rec["split"] == "train")
    _recollect_with_other_labels(root, name)
    now = trained_on(build.feature_set(cfg))
    assert now["bank"] != before["bank"] and now["features"] == before["features"]
    spec = spec_of(cfg.tap.layers, bank.read_meta(root))
    stale = (f"^predictor checkpoint {record} was trained on another bank than the one now under "
             "its key")
    with pytest.raises(CheckpointStale, match=stale):  # trained on other labels: refused
        load_predictor(predictor_dir(cfg, build.feature_set(cfg)), spec, cfg.predictor, now)
    # the features made from the old shard are refused first (train, evaluate), with their repair
    for use in (lambda: train(cfg, progress=False), lambda: build_scorers(cfg, ["linear"], spec, build.feature_set(cfg))):
        with pytest.raises(UserError, match=f"^features {build.feature_set(cfg).root} were made from another "
                                            rf"copy of the trace bank .*\(shards {name} differ\); "
                                            "repair: python -m stopexp.featurize"):
            use()
    featurize(build.feature_set(cfg))
    with pytest.raises(CheckpointStale, match=stale + r".*; rebuild it with: python -m stopexp.train") as e:
        build_scorers(cfg, ["linear"], spec, build.feature_set(cfg))  # evaluate refuses the stale predictor
    assert "\n" not in str(e.value)
    with caplog.at_level("WARNING", logger="stopexp.training.predictor"):
        train(cfg, progress=False)
    said = [r.getMessage() for r in caplog.records if "retraining" in r.getMessage()]
    assert said == [f"predictor {predictor_dir(cfg, build.feature_set(cfg))} was trained on another bank than the one now "
                    f"under its key (fingerprint {before['bank']}, now {now['bank']}: re-collected or "
                    "re-made since): retraining it on the data now there"]
    assert json.loads(record.read_text())["trained_on"] == trained_on(build.feature_set(cfg))
    load_predictor(predictor_dir(cfg, build.feature_set(cfg)), spec, cfg.predictor, trained_on(build.feature_set(cfg)))  # fits now
    # a checkpoint that records no fingerprint cannot be told from another bank's
    saved = json.loads(record.read_text())
    del saved["trained_on"]
    record.write_text(json.dumps(saved))
    with pytest.raises(CheckpointStale, match=f"^predictor checkpoint {record} records no fingerprint"):
        load_predictor(predictor_dir(cfg, build.feature_set(cfg)), spec, cfg.predictor, trained_on(build.feature_set(cfg)))
