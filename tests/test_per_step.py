"""Per-step predictors (train.positions=all, predictor.position_input) and the AUROC
against prefix length that train and evaluate report and plot."""
import json
import math

import numpy as np
import pytest
import torch

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.signals import FeatureSpec, build_predictor
from stopexp.stages.build import predictor_dir
from stopexp.stages.train import train_with_controls
from stopexp.store import bank
from stopexp.training.fit import fit
from stopexp.training.losses import _pair_mask
from stopexp.metrics.ranking import auroc_by_position
from stopexp.training.per_step import (mean_over_positions, pair_groups, position_rows,
                                       training_rows)
from stopexp.stages import build

EVAL_FAST = ["evaluate.n_points=[4,8]", "evaluate.retention=[2,4]", "policy.keep=4",
             "evaluate.bootstrap=200", "evaluate.text_metrics=false"]


def tiny_positions(seed: int = 0, prompts: int = 6, paths: int = 4, positions=(2, 5, 9), hidden=8):
    """A seeded position batch: every path at every position; the hidden state carries the
    outcome more clearly the later the position (so the curve rises)."""
    g = torch.Generator().manual_seed(seed)
    n = prompts * paths
    correct = torch.tensor([float((i % paths) < paths // 2) for i in range(n)])
    rows = []
    for k, p in enumerate(positions):
        h = torch.randn(n, 1, hidden, generator=g)
        h[:, 0, 0] += (k + 0.5) * (2 * correct - 1)
        rows.append({"hidden": h, "signals": torch.zeros(n, 9), "correct": correct,
                     "group": torch.arange(n) // paths, "mc": torch.full((n,), math.nan),
                     "alive": torch.ones(n, dtype=torch.bool), "prefix_len": torch.full((n,), float(p)),
                     "remaining": torch.zeros(n), "length": torch.full((n,), 20.0),
                     "position": torch.full((n,), p, dtype=torch.int64), "path": torch.arange(n)})
    return {k: torch.cat([r[k] for r in rows]) for k in rows[0]}


def test_pairs_are_mined_within_prompt_and_position_never_across():
    data = training_rows(tiny_positions())
    mask = _pair_mask(data)
    i, j = mask.nonzero(as_tuple=True)
    assert len(i) == 3 * 6 * 2 * 2  # positions x prompts x (2 right x 2 wrong)
    assert bool((data["position"][i] == data["position"][j]).all())
    assert bool((data["prompt_group"][i] == data["prompt_group"][j]).all())
    # the prompt alone as the group would have paired paths across positions
    across = _pair_mask({**data, "group": data["prompt_group"]})
    assert int(across.sum()) == 3 * len(i)
    assert pair_groups(torch.tensor([0, 0, 1, 1, 0]), torch.tensor([5, 9, 5, 5, 5])).tolist() == [0, 1, 2, 2, 0]


def test_auroc_by_position_and_its_mean_match_a_hand_computation():
    # position 4: prompt 0 ranks 1 right above 1 wrong (1.0), prompt 1 one of two pairs (0.5);
    # position 8: prompt 0 has a single outcome, prompt 1 ranks its one pair wrong (0.0);
    # position 12: no prompt has both outcomes
    scores = [0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.3, 0.1, 0.9, 0.7, 0.2]
    correct = [1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1]
    group = [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0]
    position = [4, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12]
    curve = auroc_by_position(scores, correct, group, position)
    assert curve["positions"] == [4, 8, 12] and curve["n_mixed_prompts"] == [2, 1, 0]
    assert curve["auroc"][:2] == [0.75, 0.0] and math.isnan(curve["auroc"][2])
    assert mean_over_positions(curve) == 0.375  # (0.75 + 0.0) / 2: the empty position skipped


def test_position_input_feeds_the_log_scaled_position_to_the_head():
    spec = FeatureSpec("toy", 8, [0])
    batch = tiny_positions()
    for name, extra in (("mlp", 128), ("linear", 1), ("fusion", 32)):  # one more input: a row of W1
        cfg = validate(compose("train", [f"predictor={name}", "predictor.position_input=true",
                                             "train.positions=all"])).predictor
        torch.manual_seed(0)
        with_pos = build_predictor(cfg, spec)
        cfg.position_input = False
        torch.manual_seed(0)
        without = build_predictor(cfg, spec)
        n_with = sum(p.numel() for p in with_pos.parameters())
        assert n_with - sum(p.numel() for p in without.parameters()) == extra, name
        assert with_pos.inputs == ("hidden", "prefix_len")
    torch.manual_seed(0)
    mlp = build_predictor(validate(compose("train", ["predictor.position_input=true", "train.positions=all"])).predictor, spec)
    moved = {**batch, "prefix_len": batch["prefix_len"] + 100}
    assert not torch.allclose(mlp(batch), mlp(moved))


@pytest.mark.parametrize("override, key, says", [
    ("train.positions=every", "train.positions", "'every' is not allowed; allowed: checkpoint, all"),
    ("predictor=statistic predictor.position_input=true", "predictor.position_input",
     "has no learned head to feed it"),
    ("predictor=conf_features predictor.position_input=true", "predictor.position_input",
     "reads prefix_len among its signal columns already"),
    ("predictor=super_token train.positions=all", "train.positions", "super_token re-encodes"),
    ("predictor.position_input=true", "predictor.position_input",
     "the position is the same for every path.*set train.positions=all"),
])
def test_bad_per_step_config_fails_at_validate(override, key, says):
    with pytest.raises(ConfigError, match=f"^{key}: .*{says}"):
        validate(compose("train", override.split()))


def test_fit_on_every_position_is_pinned():
    """A seeded tiny case of train.positions=all: the per-epoch losses and the validation
    AUROC averaged over positions, pinned. At the last validation position only 2 of 6
    prompts are mixed, so the mean over positions differs from the mean over all
    (prompt, position) groups."""
    from stopexp.metrics import within_prompt_auroc
    from stopexp.training.fit import score

    cfg = validate(compose("train", ["train.epochs=4", "train.batch_prompts=4", "predictor.hidden=8"]))
    val = tiny_positions(1)
    ended = (val["position"] == 9) & (val["correct"] == 0) & (val["group"] < 4)
    val = bank.select_rows(val, ~ended)
    data = {"train": training_rows(tiny_positions(0)), "val": training_rows(val)}
    torch.manual_seed(0)
    predictor = build_predictor(cfg.predictor, FeatureSpec("toy", 8, [0]))
    best, history = fit(predictor, data, cfg.train, cfg.loss, progress=False)
    assert [round(h["train_loss"], 6) for h in history] == [1.042452, 1.002413, 0.988817, 0.978564]
    assert [round(h["val_auroc"], 6) for h in history] == [0.625, 0.652778, 0.680556, 0.694444]
    assert all(set(h) == set(history[0]) and "val_auroc_by_prefix" not in h for h in history)
    assert best["epoch"] == 4 and best["auroc"] == history[-1]["val_auroc"]
    predictor.load_state_dict(best["state"])
    s, v = score(predictor, data["val"]), data["val"]
    curve = auroc_by_position(s, v["correct"], v["prompt_group"], v["position"])
    assert curve["n_mixed_prompts"] == [6, 6, 2]
    assert best["auroc"] == mean_over_positions(curve) == np.mean(curve["auroc"])
    assert abs(best["auroc"] - within_prompt_auroc(s.numpy(), v["correct"].numpy(), v["group"].numpy())) > 1e-3


def test_position_data_holds_every_alive_row_at_each_checkpoint(small_bank):
    from stopexp.store import feature_rows
    from stopexp.store import feature_sets

    cfg = validate(compose("train", small_bank))
    ds, rows = position_rows(build.feature_set(cfg), "val")
    feats = feature_rows.load_features(feature_sets.require_features(build.feature_set(cfg)), "val")
    for ckpt in (5, 16):
        t = feature_rows.tensors_at(ds, feats, ckpt)
        at = rows["position"] == ckpt
        assert torch.equal(rows["path"][at], t["alive"].nonzero().squeeze(-1))
        assert torch.equal(rows["hidden"][at], t["hidden"][t["alive"]])
        assert bool((rows["prefix_len"][at] == ckpt).all())
    assert set(rows) == {*t, "position", "path"}


def test_train_on_every_position_reports_and_plots_the_curve(small_bank, tmp_path):
    cfg = validate(compose("train", [*small_bank, "train.epochs=3", "train.positions=all",
                                     "predictor.position_input=true"]))
    m = train_with_controls(cfg, run_dir=tmp_path, progress=False)
    for split in ("train", "val", "test"):
        curve = m[split]["auroc_by_prefix"]
        assert curve["positions"] == [5, 16]
        assert m[split]["auroc"] == mean_over_positions(curve)
    assert (tmp_path / "auroc_by_prefix.png").exists()
    saved = json.loads((predictor_dir(cfg, build.feature_set(cfg)) / "predictor.json").read_text())
    assert saved["predictor"]["position_input"] is True
    assert saved["metrics"]["test"]["auroc_by_prefix"] == m["test"]["auroc_by_prefix"]


def test_evaluate_writes_every_methods_curve_and_the_single_checkpoint_baseline(small_bank, tmp_path):
    from stopexp.runtime.artifacts import write_json
    from stopexp.stages.evaluate import evaluate

    over = [*small_bank, *EVAL_FAST, "train.epochs=3", "train.positions=all",
            "evaluate.methods=[confidence,entropy,hidden_norm,st_bon,learned]"]
    train_with_controls(validate(compose("train", over)), progress=False)
    one = validate(compose("train", [*small_bank, "train.epochs=3"]))
    m = evaluate(validate(compose("evaluate", over)), run_dir=tmp_path)
    curves = m["auroc_by_prefix"]
    assert set(curves) == {"random", "confidence", "entropy", "hidden_norm", "st_bon", "mlp",
                           "oracle", "mlp@5"}
    assert all(c["positions"] == [5, 16] for c in curves.values())
    # at the check (5 tokens) every curve is the methods table's within-prompt AUROC
    for name, c in curves.items():
        if name != "mlp@5":
            assert c["auroc"][0] == pytest.approx(m["methods"][name]["auroc"], abs=1e-12), name
    # the baseline is the standard predictor, scored at every position
    saved = json.loads((predictor_dir(one, build.feature_set(one)) / "predictor.json").read_text())
    assert curves["mlp@5"] == saved["metrics"]["test"]["auroc_by_prefix"]
    assert curves["mlp@5"]["auroc"][0] == saved["metrics"]["test"]["auroc"]
    assert (tmp_path / "auroc_by_prefix.png").exists()
    assert m["plots"]["auroc_by_prefix"] == str(tmp_path / "auroc_by_prefix.png")
    write_json(tmp_path / "metrics.json", m)
    assert json.loads((tmp_path / "metrics.json").read_text())["auroc_by_prefix"] == json.loads(
        json.dumps(curves))
