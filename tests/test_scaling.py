"""scripts/scaling_report.py and what it added: the positions at shares of a typical path,
the AUROC against confidence with its paired bootstrap, the hidden_conf predictor, the PCA
of the tapped state (predictor.pca_components), train.early_stopping=false, their one-line
config errors, and the report end to end on the toy bank."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from sklearn.metrics import roc_auc_score

from conftest import ROOT, compose, featurized
from stopexp.config import ConfigError, validate
from stopexp.core.names import SIGNAL_NAMES
from stopexp.evaluation import scaling
from stopexp.signals import FeatureSpec, build_predictor
from stopexp.signals.pca import PCA

spec = importlib.util.spec_from_file_location("scaling_report", ROOT / "scripts" / "scaling_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


# ---- where along a path, and against confidence -------------------------------------------
def test_the_grid_is_the_checkpoints_and_the_stride_not_the_step_ends():
    assert scaling.grid_positions({"checkpoints": [14, 28], "stride": 7, "separator": "\n"}, 40) == \
        [7, 14, 21, 28, 35]
    assert scaling.grid_positions({"checkpoints": [5, 16], "stride": None, "separator": ";"}, 64) == [5, 16]


def test_positions_at_shares_of_the_median_path():
    grid = scaling.grid_positions({"checkpoints": [14, 28], "stride": 7}, 160)
    # 0.2 .. 0.8 x 63 tokens = 12.6, 25.2, 37.8, 50.4
    assert scaling.share_positions(63, grid) == [14, 28, 35, 49]
    assert scaling.share_positions(10, [1, 3], [0.2]) == [1]  # 2 is as near 1 as 3: the earlier
    assert scaling.share_positions(1000, [5, 16]) == [16, 16, 16, 16]
    with pytest.raises(ValueError, match="need stored positions"):
        scaling.share_positions(63, [])


def test_sizes_are_lowered_to_what_the_bank_holds():
    assert scaling.clip_sizes([150, 300, 600, 1200], 150) == [150]
    assert scaling.clip_sizes([100, 50, 150], 150) == [50, 100, 150]
    assert scaling.clip_sizes([150, 300], 200) == [150, 200]
    assert scaling.parse_sizes("50,100,150") == [50, 100, 150]


@pytest.mark.parametrize("call, message", [
    (lambda: scaling.parse_sizes("50,a"), "--sizes: '50,a' is not a comma-separated list of prompt "
                                          "counts, e.g. --sizes=150,300,600,1200"),
    (lambda: scaling.clip_sizes([0, 150], 150), r"--sizes: give training prompt counts >= 1, e.g. "
                                                r"--sizes=150,300,600,1200; got \[0, 150\]"),
    (lambda: report.parse(["--size=50"]), "--size: unknown option; give --sizes=... or --out=... "
                                          "and Hydra overrides"),
    (lambda: report.parse(["--out"]), "--out: unknown option"),
])
def test_a_bad_option_is_one_line(call, message):
    with pytest.raises(ConfigError, match=f"^{message}") as e:
        call()
    assert "\n" not in str(e.value)


def test_versus_confidence_by_hand():
    # prompt 0: mixed (AUROC 1.0 for the scores, 0.5 for the reference); prompt 1: all wrong
    # (no AUROC, left out); prompt 2: mixed (0.0 and 1.0)
    scores = np.array([0.9, 0.1, 0.2, 0.5, 0.3, 0.1, 0.8])
    reference = np.array([0.5, 0.5, 0.0, 0.0, 0.0, 0.9, 0.1])
    correct = np.array([1, 0, 0, 0, 0, 1, 0])
    group = np.array([0, 0, 1, 1, 1, 2, 2])
    got = scaling.versus(scores, reference, correct, group, n_boot=200, seed=3)
    assert got["auroc"] == 0.5 and got["reference_auroc"] == 0.75 and got["mixed_prompts"] == 2
    d = np.array([1.0 - 0.5, 0.0 - 1.0])  # per mixed prompt
    draws = d[np.random.default_rng(3).integers(0, 2, size=(200, 2))].mean(1)
    assert got["diff"] == pytest.approx(d.mean()) and got["ci"] == pytest.approx(
        np.quantile(draws, [0.025, 0.975]).tolist())
    assert scaling.cell({**got, "ci": [-0.25, 0.125]}) == "0.500 (-0.250 [-0.250, +0.125])"


# ---- the PCA, hidden_conf, and their config errors -----------------------------------------
def test_the_pca_whitens_the_training_rows_on_their_leading_axes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 6, generator=g) @ torch.randn(6, 6, generator=g) + 3.0
    pca = PCA(6, 3).fit(x)
    y = pca(x).double()
    assert torch.allclose(y.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(y.T @ y / len(y), torch.eye(3, dtype=torch.float64), atol=1e-4)
    z = ((x - x.mean(0)) / x.std(0, correction=0)).numpy().astype(np.float64)
    values = np.linalg.eigvalsh(z.T @ z / len(z))[::-1][:3]
    assert np.allclose(pca.spread.numpy() ** 2, values, rtol=1e-6)
    assert torch.allclose(pca.axes.T @ pca.axes, torch.eye(3, dtype=pca.axes.dtype), atol=1e-6)
    with pytest.raises(RuntimeError, match="never fitted"):
        PCA(6, 3)(x)
    with pytest.raises(ValueError, match=r"^predictor.pca_components: 7 must lie in 1..6"):
        PCA(6, 7)


def head(name: str, **extra):
    keys = {"name": name, "layer": -1, "hidden": 4, "depth": 1, "dropout": 0.0, "position_input": False,
            "centre_prompts": False, "pca_components": None, "signals": []}
    return OmegaConf.create({**keys, **extra})


def test_hidden_conf_reads_the_state_and_the_confidence_columns():
    spec = FeatureSpec("toy", 8, [1, 2])
    torch.manual_seed(0)
    p = build_predictor(head("hidden_conf"), spec)
    assert p.inputs == ("hidden", "signals") and p.hidden_proj.in_features == 8
    assert p.signal_proj.in_features == 5  # conf_features' CONF_SIGNALS
    assert build_predictor(head("hidden_conf", signals=["hidden_norm"]), spec).signal_proj.in_features == 6
    batch = {"hidden": torch.randn(6, 2, 8), "signals": torch.randn(6, len(SIGNAL_NAMES))}
    p.eval()
    base = p(batch)
    moved = dict(batch, signals=batch["signals"].clone())
    moved["signals"][:, SIGNAL_NAMES.index("mean_logprob")] += 1.0
    assert not torch.allclose(p(moved), base)  # a confidence column moves the score
    deepest, first = batch["hidden"].clone(), batch["hidden"].clone()
    deepest[:, 1] += torch.randn(6, 8)
    first[:, 0] += torch.randn(6, 8)
    assert not torch.allclose(p(dict(batch, hidden=deepest)), base)  # so does the layer it reads (-1)
    assert torch.equal(p(dict(batch, hidden=first)), base)  # not another tapped layer
    with pytest.raises(ValueError, match="depth must be >= 1"):
        build_predictor(head("hidden_conf", depth=0), spec)
    pca = build_predictor(head("mlp", pca_components=3), spec)
    assert pca.in_dim == 3 and not hasattr(pca, "norm")


@pytest.mark.parametrize("overrides, message", [
    (["predictor=fusion", "tap=multi", "predictor.pca_components=8"],
     "predictor.pca_components: predictor=fusion reads every tapped layer (its own projection of "
     "each); allowed with linear, mlp, hidden_conf"),
    (["predictor=conf_features", "predictor.pca_components=8"],
     "predictor.pca_components: predictor=conf_features reads no hidden state; allowed with "
     "linear, mlp, hidden_conf"),
    (["predictor=statistic", "predictor.pca_components=8"],
     "predictor.pca_components: predictor=statistic has no learned head on one tapped layer's "
     "state; allowed with linear, mlp, hidden_conf"),
    (["predictor.pca_components=0"], "predictor.pca_components: must be >= 1, got 0"),
    (["predictor=hidden_conf", "predictor.position_input=true"],
     "predictor.position_input: predictor=hidden_conf reads prefix_len among its signal columns "
     "already; allowed with linear, mlp, fusion"),
    (["predictor=hidden_conf", "predictor.depth=0"], "predictor.depth: must be >= 1, got 0"),
])
def test_what_a_predictor_cannot_use_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(compose("train", ["logger=none", *overrides]))
    assert str(e.value) == message


def test_the_new_keys_are_accepted_where_read():
    for extra in (["predictor=hidden_conf", "predictor.centre_prompts=true", "predictor.pca_components=4"],
                  ["predictor=linear", "predictor.pca_components=4"], ["train.early_stopping=false"]):
        validate(compose("train", ["logger=none", *extra]))


# ---- end to end on the toy bank --------------------------------------------------------------
def prompt_ids(cfg):
    """The bank's train prompt ids a config's predictor trains on."""
    from stopexp.stages import build
    from stopexp.store import bank

    root = build.bank(cfg).root
    data = build.training_data(cfg, build.feature_set(cfg), bank.read_meta(root))
    ids = np.asarray(bank.load_bank(root, "train")["prompt_id"][:])
    return set(ids[data["train"]["path"].numpy()].tolist())


@pytest.mark.slow
def test_the_report_end_to_end_on_the_toy_bank(small_bank, tmp_path, capsys):
    from stopexp.metrics import paired_difference
    from stopexp.signals.saved_predictor import load_predictor
    from stopexp.stages import build
    from stopexp.store import bank, feature_rows, feature_sets

    over = [*small_bank, "tap.positions.stride=8", "train.positions=all", "train.epochs=3",
            "evaluate.bootstrap=200"]
    cfg = featurized(validate(compose("train", over)))  # features every 8 tokens: a re-tap, no recollection
    out = tmp_path / "report"
    got = report.main([*over, "--sizes=4,8,30", f"--out={out}"])
    assert got["sizes"] == [4, 8, 12] and got["train_prompts_held"] == 12  # 30: all 12 the bank holds
    assert len(got["positions"]) == 4 and got["positions"] == sorted(got["positions"])
    assert set(got["positions"]) <= set(scaling.grid_positions(build.feature_set(cfg).positions, 64))

    # every size x predictor; the sizes nested, the largest with train.max_prompts unset
    rows = {(r["size"], r["predictor"]): r for r in got["by_size"]}
    assert set(rows) == {(n, p) for n in (4, 8, 12) for p in report.PREDICTORS}
    assert [rows[(n, "mlp")]["train_prompts"] for n in (4, 8, 12)] == [4, 8, 12]
    assert rows[(12, "mlp")]["overrides"] == []
    ids = {n: prompt_ids(validate(compose("train", [*over, *rows[(n, "mlp")]["overrides"]])))
           for n in (4, 8, 12)}
    assert ids[4] == {0, 1, 2, 3} and ids[4] < ids[8] < ids[12] and len(ids[12]) == 12
    assert rows[(12, "mlp")]["checkpoint"] == str(build.predictor_dir(cfg, build.feature_set(cfg)))

    # the controls on the largest size, the layers at the best one
    assert [c["control"] for c in got["controls"]] == [label for label, _ in report.CONTROLS]
    assert got["controls"][0]["checkpoint"] == rows[(12, "mlp")]["checkpoint"]
    last = next(c for c in got["controls"] if c["control"] == "no early stopping")
    assert last["best_epoch"] == last["epochs"] == 3  # every epoch, the last kept
    assert len({c["checkpoint"] for c in got["controls"]}) == len(report.CONTROLS)
    assert got["best_size"] in (4, 8, 12)
    assert [(r["layer"], r["predictor"]) for r in got["layers"]] == [
        (layer, p) for layer in got["tap_layers"] for p in report.LAYER_PREDICTORS]

    # the PCA is fitted on the training rows only and saved with the predictor
    pca_row = next(c for c in got["controls"] if c["control"] == "PCA 32")
    pca_cfg = validate(compose("train", [*over, "predictor.pca_components=32"]))
    fs = build.feature_set(cfg)
    spec_ = feature_sets.spec_of(cfg.tap.layers, bank.read_meta(fs.bank.root))
    model, _ = load_predictor(pca_row["checkpoint"], spec_, pca_cfg.predictor)
    train_rows = build.training_data(pca_cfg, fs, bank.read_meta(fs.bank.root))["train"]
    want = PCA(spec_.hidden_size, 32).fit(train_rows["hidden"][:, -1])
    assert torch.allclose(model.pca.axes, want.axes) and torch.allclose(model.pca.mean, want.mean)

    # one cell by hand: mlp on 8 prompts at the first position, against confidence
    ds, feats = feature_rows.load_split(fs, "test")
    p0 = got["positions"][0]
    batch = feature_rows.position_batch(ds, feats, [p0])
    mlp_cfg = validate(compose("train", [*over, *rows[(8, "mlp")]["overrides"]]))
    model, _ = load_predictor(rows[(8, "mlp")]["checkpoint"], spec_, mlp_cfg.predictor)
    with torch.no_grad():
        s = model(batch).numpy()
    conf = batch["signals"][:, SIGNAL_NAMES.index("mean_logprob")].numpy()
    y, g = batch["correct"].numpy() > 0.5, batch["group"].numpy()
    a, b = [], []
    for prompt in np.unique(g):
        at = g == prompt
        if y[at].any() and not y[at].all():
            a.append(roc_auc_score(y[at], s[at]))
            b.append(roc_auc_score(y[at], conf[at]))
    cell = rows[(8, "mlp")]["at"][0]
    assert cell["position"] == p0 and cell["mixed_prompts"] == len(a) > 0
    assert cell["auroc"] == pytest.approx(np.mean(a)) and cell["reference_auroc"] == pytest.approx(np.mean(b))
    assert cell["diff"] == pytest.approx(np.mean(np.subtract(a, b)))
    assert cell["ci"] == pytest.approx(paired_difference(np.array(a), np.array(b), 200, 0)["ci"])

    # the tables, the JSON and the figure
    printed = capsys.readouterr().out
    r8 = rows[(8, "mlp")]
    assert r8["test_auroc"] == pytest.approx(np.mean([a["auroc"] for a in r8["at"]]))  # 4 positions, all mixed
    saved = json.loads((Path(r8["checkpoint"]) / "predictor.json").read_text())["metrics"]
    assert r8["train_metrics_auroc"]["train"] == saved["train"]["auroc"]
    # the training-prompt AUROC by hand: the mlp of 8 prompts on the train paths of prompts 0..7
    ds, feats = feature_rows.load_split(fs, "train")
    tb = feature_rows.position_batch(ds, feats, got["positions"])
    with torch.no_grad():
        ts = model(tb).numpy()
    ty, tg, tp = tb["correct"].numpy() > 0.5, tb["group"].numpy(), tb["position"].numpy()
    mine = np.isin(np.asarray(ds["prompt_id"][:])[tb["path"].numpy()], range(8))
    per_position = []
    for q in np.unique(tp):
        values = [roc_auc_score(ty[at], ts[at]) for prompt in np.unique(tg[mine & (tp == q)])
                  for at in [mine & (tp == q) & (tg == prompt)] if 0 < ty[at].sum() < at.sum()]
        per_position += [np.mean(values)] if values else []
    assert r8["train_auroc"] == pytest.approx(np.mean(per_position))
    assert printed.count("| prompts | predictor | train / val / test |") == 1
    assert f"| 8 | mlp | {r8['train_auroc']:.3f} / {r8['val_auroc']:.3f} / {r8['test_auroc']:.3f} | " \
           f"{scaling.cell(cell)} |" in printed
    assert "| dropout 0.5 | " in printed and "| PCA 32 | " in printed and "| centred per prompt | " in printed
    assert json.loads((out / "scaling.json").read_text())["by_size"][0]["at"][0]["diff"] == \
        pytest.approx(got["by_size"][0]["at"][0]["diff"])
    assert (out / "scaling.png").stat().st_size > 10_000
