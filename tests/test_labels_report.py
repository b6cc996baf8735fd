"""scripts/labels_report.py: soft (Monte Carlo) against hard (outcome) labels and the super
token, each trained by the train stage and scored on the same test paths, end to end on the
toy bank (its Monte Carlo labels: collect.mc_rollouts=2), a cell and the soft - hard
difference by hand, and its one-line errors."""
import importlib.util

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from conftest import ROOT, compose
from stopexp.config import ConfigError, validate

spec = importlib.util.spec_from_file_location("labels_report", ROOT / "scripts" / "labels_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


@pytest.mark.parametrize("argv, message", [
    (["--label=soft"], "--label: unknown option; allowed: --predictors, --labels, --out"),
    (["--labels=soft,soft2"], "--labels: 'soft,soft2'; give a comma-separated list of soft, hard, pairs"),
    (["--predictors="], "--predictors: give a value, e.g. --predictors=mlp,super_token"),
    (["--predictors=mlp,nope"], "--predictors: 'mlp,nope'; give a comma-separated list of statistic, "),
    (["--out", "x=1"], "--out: give a value, e.g. --out=DIR"),
])
def test_a_bad_option_is_one_line(argv, message):
    with pytest.raises(ConfigError, match=f"^{message}") as e:
        report.parse(argv)
    assert "\n" not in str(e.value)


def test_repeated_values_train_once():
    assert report.parse(["--labels=soft,hard,soft", "x=1"]) == ({"--labels": ["soft", "hard"]}, ["x=1"])


def test_a_checkpoint_without_monte_carlo_labels_is_refused(small_bank):
    # 8 tokens: a stride position the features may hold, but no rollouts were run there
    with pytest.raises(ConfigError, match=r"^train.checkpoint: the bank \w+ holds Monte Carlo "
                                          r"labels at \[5, 16\] \(collect.mc_rollouts=2\), not at 8"):
        report.main([*small_bank, "tap.positions.stride=8", "train.checkpoint=8"])


def test_soft_hard_and_the_super_token_on_the_toy_bank(small_bank, tmp_path):
    from stopexp.signals import methods as M
    from stopexp.stages import build
    from stopexp.stages.scorers import load_trained
    from stopexp.store import bank, feature_sets

    over = [*small_bank, "train.epochs=2", "evaluate.bootstrap=200"]
    got = report.main([*over, "--predictors=mlp,super_token", f"--out={tmp_path}"])
    assert (tmp_path / "labels.json").exists()
    assert [(r["predictor"], r["labels"]) for r in got["rows"]] == [
        (p, label) for p in ("mlp", "super_token") for label in ("soft", "hard", "pairs")]
    assert len({r["checkpoint"] for r in got["rows"]}) == 6  # six predictors, six keys
    assert {r["train_prompts"] for r in got["rows"]} == {12}  # the small bank's train split

    # the mlp on soft labels, by hand: per-prompt AUROC on the test paths alive at 5 tokens
    cfg = validate(compose("train", [*over, "loss=reward_regression"]))
    features = build.feature_set(cfg)
    meta = bank.read_meta(features.bank.root)
    test = build.training_data(cfg, features, meta, prefixes=True)["test"]
    model = load_trained(cfg, feature_sets.spec_of(cfg.tap.layers, meta), features)
    s = M.learned(model)(test).numpy()
    y, g = test["correct"].numpy() > 0.5, test["group"].numpy()
    by_hand = np.mean([roc_auc_score(y[g == p], s[g == p]) for p in np.unique(g)
                       if y[g == p].any() and not y[g == p].all()])
    soft = got["rows"][0]
    assert soft["auroc"] == pytest.approx(by_hand, abs=1e-12)
    assert got["test_paths"] == len(y)

    # soft - hard: the difference of the two rows over the same mixed prompts
    for p in ("mlp", "super_token"):
        rows = {r["labels"]: r for r in got["rows"] if r["predictor"] == p}
        d = got["soft_minus_hard"][p]
        assert d["diff"] == pytest.approx(rows["soft"]["auroc"] - rows["hard"]["auroc"], abs=1e-12)
        assert d["ci"][0] <= d["diff"] <= d["ci"][1]
    # the targets differ (Monte Carlo rates against 0/1 outcomes), so the trained mlps do
    hard_cfg = validate(compose("train", [*over, "loss=reward_regression", "loss.labels=reward"]))
    hard = M.learned(load_trained(hard_cfg, feature_sets.spec_of(cfg.tap.layers, meta), features))(test)
    assert not np.allclose(hard.numpy(), s, atol=1e-3)
