"""Features as a second artifact: teacher-forced extraction equals the decode-time taps, a
tap change re-extracts without regenerating, damaged features are named, positions are
validated, and the two batch views agree."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import FP32_REORDER, compose, featurized
from stopexp.config import ConfigError, validate
from stopexp.models import extract as feature_extract
from stopexp.search.taps import Taps
from stopexp.store import bank, feature_rows
from stopexp.store import feature_sets
from stopexp.stages import build
from stopexp.stages.featurize import featurize


@pytest.fixture(scope="module")
def eager_lm(tiny_lm):
    model, tok = tiny_lm
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")  # attention weights, for the entropy tap
    return eager, tok


@pytest.mark.parametrize("pooling, layers", [("last", [0, -1]), ("mean", [0, -1]),
                                             ("last", [0])])  # [0]: the forward stops early
def test_extracted_features_equal_decode_time_features(eager_lm, pooling, layers):
    from stopexp.search.decode import SamplingParams, make_engine

    model, tok = eager_lm
    # prompts of different lengths (left padding in both passes), several paths each
    prompts = [tok("4+7*3-9?")["input_ids"], tok("1-2?")["input_ids"], tok("3*7+1-2*9?")["input_ids"]] * 3
    checkpoints = (1, 3, 6, 9)
    heads = "all" if len(layers) > 1 else ["0:1", "0:3"]
    with Taps(model, layers, pooling, attention_heads=heads) as taps:
        engine = make_engine(model, tok, SamplingParams(max_new_tokens=12, temperature=1.5), taps,
                             checkpoints)
        state = engine.run(engine.launch(prompts, list(range(len(prompts)))))
    tokens, *_, lengths = state.tensors(tok.pad_token_id)
    assert len(set(lengths.tolist())) > 1  # paths of several lengths: some end before a checkpoint
    seqs = [(prompts[p], tokens[p, :n].tolist(), [c for c in checkpoints if c < n])
            for p, n in enumerate(lengths.tolist())]
    with Taps(model, layers, pooling, attention_heads=heads, sequence=True) as taps:
        got = feature_extract.extract(model, taps, seqs, tok.pad_token_id, batch_tokens=40)
    compared = 0
    for c in checkpoints:
        rows, feats = state.features[c]
        assert sorted(rows.tolist()) == [p for p, n in enumerate(lengths.tolist()) if n > c]
        for r, p in enumerate(rows.tolist()):
            k = seqs[p][2].index(c)
            hidden, attn = got[p]
            assert hidden.shape == (len(seqs[p][2]), len(layers), 32)
            np.testing.assert_allclose(hidden[k], feats[r].numpy(), **FP32_REORDER)
            assert attn[k] == pytest.approx(float(state.attn[c][r]), abs=FP32_REORDER["atol"])
            compared += 1
    assert compared >= 20


def _snapshot(root):
    return {str(p): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_tap_change_reextracts_without_regenerating(small_bank, monkeypatch, caplog):
    import stopexp.stages.collect

    cfg = validate(compose("train", small_bank))
    first = feature_sets.require_features(build.feature_set(cfg))
    root = build.bank(cfg).root
    before = _snapshot(root)
    monkeypatch.setattr(stopexp.stages.collect, "collect", lambda *a, **k: pytest.fail("regenerated"))
    other = validate(compose("train", [*small_bank, "tap.layers=[0,1]", "tap.pooling=mean",
                                       "tap.positions.stride=4", "tap.positions.step_ends=true"]))
    assert build.bank(other).root == root and build.feature_set(other).root != first
    with pytest.raises(bank.BankMissing, match="python -m stopexp.featurize"):
        feature_sets.require_features(build.feature_set(other))
    with caplog.at_level("INFO", logger="stopexp.stages.featurize"):
        featurize(build.feature_set(other))
    second = feature_sets.require_features(build.feature_set(other))
    assert "extracting features" in caplog.text and _snapshot(root) == before
    meta = bank.read_meta(second)
    assert meta["tap_layers"] == [0, 1] and meta["bank"] == root.name and meta["pooling"] == "mean"
    ds, feats = feature_rows.load_split(build.feature_set(other), "train")
    for i in range(len(ds)):  # every stride multiple and checkpoint below the length
        n = int(ds["length"][i])
        pos = set(feats.positions[feats.offsets[i]:feats.offsets[i + 1]].tolist())
        assert {c for c in (4, 5, 8, 12, 16, 20) if c < n} <= pos and max(pos) < n
    # the Monte Carlo labels stay at tap.checkpoints; elsewhere NaN while alive
    batch = feature_rows.position_batch(ds, feats)
    at5 = batch["position"] == 5
    assert not torch.isnan(batch["mc"][at5]).any() and torch.isnan(batch["mc"][batch["position"] == 4]).all()


def test_step_ends_are_the_separator_tokens(small_bank):
    cfg = featurized(validate(compose("train", [*small_bank, "tap.positions.step_ends=true"])))
    ds, feats = feature_rows.load_split(build.feature_set(cfg), "val")

    _, tok = build.lm(cfg, progress=False)
    semi = tok.convert_tokens_to_ids(";")
    for i in range(len(ds)):
        toks, n = ds["tokens"][i], int(ds["length"][i])
        want = {c for c in range(1, n) if toks[c - 1] == semi} | {c for c in (5, 16) if c < n}
        assert feats.positions[feats.offsets[i]:feats.offsets[i + 1]].tolist() == sorted(want)


def test_views_agree_and_signals_match_the_bank(small_bank):
    from stopexp.signals.feature_spec import SIGNAL_NAMES

    cfg = validate(compose("train", small_bank))
    ds, feats = feature_rows.load_split(build.feature_set(cfg), "test")
    at = feature_rows.tensors_at(ds, feats, 5)
    pb = feature_rows.position_batch(ds, feats, positions=[5])
    alive = at["alive"]
    assert torch.equal(pb["path"], torch.nonzero(alive).squeeze(-1))
    for key in ("hidden", "signals", "group", "correct", "mc", "prefix_len", "remaining", "length"):
        assert torch.equal(at[key][alive], pb[key]), key
    assert not at["hidden"][~alive].any() and (pb["position"] == 5).all()
    lp = ds["token_logprob"][0]
    assert at["signals"][0, SIGNAL_NAMES.index("mean_logprob")] == pytest.approx(lp[:5].mean(), abs=1e-6)
    assert at["signals"][0, SIGNAL_NAMES.index("prefix_len")] == 5
    norm = at["signals"][:, SIGNAL_NAMES.index("hidden_norm")]
    assert torch.allclose(norm, at["hidden"][:, -1].norm(dim=-1))
    with pytest.raises(ValueError, match="hold no position 7 .* add it to tap.checkpoints or tap.positions"):
        feature_rows.tensors_at(ds, feats, 7)
    other_ds = bank.load_bank(build.bank(cfg).root, "val")
    with pytest.raises(ValueError, match="not those of this bank split"):
        feature_rows.tensors_at(other_ds, feats, 5)


def test_float16_features_halve_the_bytes(small_bank):
    base = validate(compose("train", [*small_bank, "tap.positions.stride=2"]))
    half = validate(compose("train", [*small_bank, "tap.positions.stride=2", "tap.positions.dtype=float16"]))
    sizes = {}
    for name, cfg in (("f32", base), ("f16", half)):
        meta = bank.read_meta(feature_sets.require_features(build.feature_set(featurized(cfg))))
        sizes[name] = sum(f["size"] for r in meta["shards"].values() for f in r["files"].values())
        ds, feats = feature_rows.load_split(build.feature_set(cfg), "val")
        sizes[name + "_hidden"] = feats.hidden
    assert sizes["f16_hidden"].dtype == np.float16 and sizes["f32_hidden"].dtype == np.float32
    np.testing.assert_allclose(sizes["f16_hidden"].astype(np.float32), sizes["f32_hidden"], rtol=2e-3, atol=2e-3)
    assert sizes["f16"] < 0.6 * sizes["f32"]


def test_damaged_features_name_the_file_and_the_command(small_bank, tmp_path):
    import shutil

    cfg = validate(compose("train", small_bank))
    out = feature_sets.require_features(build.feature_set(cfg))
    shard = sorted(p for p in out.glob("shard-*") if (p / "dataset_info.json").exists())[0]
    arrow = sorted(shard.glob("*.arrow"))[0]
    keep = tmp_path / "keep.arrow"
    shutil.copy(arrow, keep)
    with open(arrow, "r+b") as f:
        f.truncate(arrow.stat().st_size - 100)
    try:
        with pytest.raises(bank.BankDamaged) as err:
            feature_sets.require_features(build.feature_set(cfg), ["+exp=toy_contrastive"])
        msg = str(err.value)
        assert f"features {out} is damaged: {shard.name}: {arrow.name} has" in msg
        assert "python -m stopexp.featurize +exp=toy_contrastive" in msg
        with pytest.raises(bank.BankDamaged, match=f"(?s){arrow.name}.*python -m stopexp.featurize"):
            feature_rows.load_split(build.feature_set(cfg), "train")
        featurize(build.feature_set(cfg))  # repairs: recomputes the damaged shard only
        assert bank.verify_bank(out, full=True, kind="features", version=feature_sets.FEATURES_VERSION)
    finally:
        if not arrow.exists() or arrow.stat().st_size != keep.stat().st_size:
            shutil.copy(keep, arrow)


def _private_bank(small_bank, tmp_path):
    """Overrides of a private copy of the session's small bank (its features made there)."""
    import shutil

    overrides = [*small_bank, f"paths.output_dir={tmp_path / 'out'}"]
    shutil.copytree(build.bank(validate(compose("collect", small_bank))).root,
                    build.bank(validate(compose("collect", overrides))).root)
    return overrides


def test_features_of_another_tap_under_this_key_are_refused_and_featurize_repairs(small_bank, tmp_path):
    import shutil

    from stopexp.stages.evaluate import evaluate
    from stopexp.stages.train import train_with_controls

    fast = ["predictor=linear", "train.epochs=2", "evaluate.methods=[learned]",
            "evaluate.text_metrics=false", "evaluate.n_points=[4,8]", "evaluate.retention=[2,4]",
            "policy.keep=4", "evaluate.bootstrap=50"]
    overrides = [*_private_bank(small_bank, tmp_path), *fast]
    cfg = featurized(validate(compose("evaluate", overrides)))
    trained = train_with_controls(cfg, progress=False)  # on the features of this tap (the last layer, 2)
    record = Path(trained["checkpoint"]) / "predictor.json"
    written = (record.stat().st_ino, record.stat().st_mtime_ns)
    out = build.feature_set(cfg).root
    reference = feature_rows.load_features(out, "test").hidden.copy()
    other = validate(compose("evaluate", [*overrides, "tap.layers=[0]"]))
    shutil.rmtree(out)
    shutil.copytree(feature_sets.require_features(build.feature_set(featurized(other))), out)  # layer 0's, under this key
    want = (f"features {out} does not fit this config: its meta.json records tap_layers=[0], this "
            "config expects [2]; repair: python -m stopexp.featurize +exp=toy_contrastive (it recomputes ")
    with pytest.raises(bank.ArtifactMismatch) as err:
        feature_sets.require_features(build.feature_set(cfg), ["+exp=toy_contrastive"])
    assert str(err.value).startswith(want)
    with pytest.raises(bank.ArtifactMismatch, match="records tap_layers=\\[0\\]"):
        evaluate(cfg)  # not layer 0 scored by the layer-2 predictor
    with pytest.raises(bank.ArtifactMismatch, match="records tap_layers=\\[0\\]"):
        train_with_controls(cfg, progress=False)  # the cached predictor is not reused either
    summary = featurize(build.feature_set(cfg))  # every shard names the other features: recomputed
    assert bank.read_meta(out)["tap_layers"] == [2] and summary["paths"] == 24 * 8
    assert np.array_equal(feature_rows.load_features(out, "test").hidden, reference)
    assert set(evaluate(cfg)["methods"]) >= {"linear", "no_prune"}
    # the features fit again: the cached predictor, not a retrained one
    assert train_with_controls(cfg, progress=False)["checkpoint"] == trained["checkpoint"]
    assert (record.stat().st_ino, record.stat().st_mtime_ns) == written


def test_a_features_record_with_another_width_is_refused_and_featurize_rewrites_it(small_bank, tmp_path):
    cfg = featurized(validate(compose("train", _private_bank(small_bank, tmp_path))))
    out = feature_sets.require_features(build.feature_set(cfg))
    original = bank.read_meta(out)
    shards = _snapshot(out)
    (out / "meta.json").write_text(json.dumps({**original, "hidden_size": 64}))
    for consumer in (lambda: feature_sets.require_features(build.feature_set(cfg)),
                     lambda: feature_rows.load_split(build.feature_set(cfg), "test")):
        with pytest.raises(bank.ArtifactMismatch, match=f"^features {out} does not fit this config: "
                                                        "its meta.json records hidden_size=64, this "
                                                        "config expects 96; repair: python -m "
                                                        "stopexp.featurize"):
            consumer()  # named at once, not an IndexError in evaluate
    featurize(build.feature_set(cfg))  # rewrites the record (its shards fit)
    assert bank.read_meta(out) == original
    assert {k: v for k, v in _snapshot(out).items() if "meta.json" not in k} == \
        {k: v for k, v in shards.items() if "meta.json" not in k}  # the shards fit: kept
    ds, feats = feature_rows.load_split(build.feature_set(cfg), "test")
    assert feats.hidden.shape[1:] == (1, 96)


@pytest.mark.parametrize("record_fits", [True, False])
def test_shards_whose_records_name_no_features_are_judged_by_the_record(
        small_bank, tmp_path, record_fits):
    cfg = featurized(validate(compose("train", _private_bank(small_bank, tmp_path))))
    out = feature_sets.require_features(build.feature_set(cfg))
    meta = bank.read_meta(out)
    for name in meta["shards"]:  # records that name no features and no tap
        rec = {k: v for k, v in meta["shards"][name].items()
               if k not in ("features", *feature_sets.TAP_INFO)}
        (out / name / bank.MANIFEST).write_text(json.dumps(rec))
        meta["shards"][name] = rec
    if not record_fits:
        meta["tap_layers"] = [0]
    (out / "meta.json").write_text(json.dumps(meta))
    shards = {k: v for k, v in _snapshot(out).items() if "meta.json" not in k}
    featurize(build.feature_set(cfg))
    kept = {k: v for k, v in _snapshot(out).items() if "meta.json" not in k} == shards
    assert kept == record_fits  # a record of another tap vouches for none of them
    assert bank.read_meta(feature_sets.require_features(build.feature_set(cfg)))["tap_layers"] == [2]


def test_old_bank_says_rerun_collect(small_bank, tmp_path):
    import shutil

    root = build.bank(validate(compose("collect", small_bank))).root
    old = tmp_path / "old"
    shutil.copytree(root, old)
    meta = json.loads((old / "meta.json").read_text())
    meta["version"] = 3
    (old / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(bank.BankDamaged, match=r"(?s)trace bank version 3, 4 expected.*features are a "
                                               r"separate artifact\); repair: rerun the collect command"):
        bank.load_bank(old)


@pytest.mark.parametrize("override, key", [
    ("tap.positions.stride=0", "tap.positions.stride"),
    ("tap.positions.stride=64", "tap.positions.stride"),
    ("tap.positions.checkpoints=[2.5]", "tap.positions.checkpoints"),
    ("tap.positions.checkpoints=[64]", "tap.positions.checkpoints"),
    ("tap.positions.dtype=float64", "tap.positions.dtype"),
])
def test_bad_positions_fail_at_validate(tmp_path, override, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        validate(compose("train", ["logger=none", f"paths.output_dir={tmp_path}", override]))


def test_keys_split_generation_from_taps(tmp_path):
    base = ["logger=none", f"paths.output_dir={tmp_path}"]
    plain = validate(compose("train", base))
    for change in ("tap.layers=[0]", "tap.pooling=mean", "tap.attention_heads=all",
                   "tap.positions.stride=8", "tap.positions.dtype=float16", "tap.checkpoints=[0.1,0.25]"):
        other = validate(compose("train", [*base, change, "train.checkpoint=0.25", "search.check_at=0.25"]))
        assert build.bank(other).key == build.bank(plain).key, change
        assert build.feature_set(other).key != build.feature_set(plain).key, change
    # Monte Carlo labels are generated at the checkpoints: then they key the bank
    mc = [*base, "collect.mc_rollouts=2"]
    a = validate(compose("train", mc))
    b = validate(compose("train", [*mc, "tap.checkpoints=[0.1,0.25]", "train.checkpoint=0.25",
                                   "search.check_at=0.25"]))
    assert build.bank(a).key != build.bank(b).key


def test_a_shared_prefix_is_computed_once():
    seqs = [([1, 2], [5, 6, 7, 8], [1, 3]), ([1, 2], [5, 6, 9], [2]), ([1, 2], [5, 6, 7, 8, 4], [4]),
            ([3], [5, 6], [1]), ([1, 2], [5], [])]
    wanted, owner = feature_extract.shared_prefixes(seqs)
    assert owner == [2, 2, 2, 3, -1] and wanted == {2: [1, 2, 3, 4], 3: [1]}
