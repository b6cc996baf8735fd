"""Paired statistics of the probe against its controls (stopexp/evaluation/paired.py): the
paired bootstrap over prompts of the within-prompt AUROC and vote-accuracy differences, on
hand-computed cases and in a tiny evaluate run's metrics.json, table and figure."""
import json

import numpy as np
import pytest

from conftest import compose, run_stage
from stopexp.config import validate
from stopexp.evaluation.paired import at_check, by_prefix, is_probe
from stopexp.evaluation.table import paired_lines
from stopexp.metrics import bootstrap_ci, paired_difference
from stopexp.stages.train import train_with_controls

# Four prompts of four paths (two right, two wrong, except prompt 3: all right). Within each
# prompt the AUROC is (pairs ranked right) / 4, so every value is exact in binary:
#   prompt  mlp    confidence  hidden_norm
#   0       1.00   0.50        0.25
#   1       0.75   0.25        0.50
#   2       1.00   0.75        1.00
#   3       -      -           -          (single outcome: excluded from every AUROC)
CORRECT = np.array([1, 1, 0, 0] * 4, bool)
CORRECT[12:] = True
GROUP = np.repeat(np.arange(4), 4)
SCORES = {
    "mlp":         np.array([4, 3, 2, 1,  4, 2, 3, 1,  4, 3, 2, 1,  1, 2, 3, 4], float),
    "confidence":  np.array([4, 1, 3, 2,  3, 1, 4, 2,  4, 2, 3, 1,  1, 2, 3, 4], float),
    "hidden_norm": np.array([3, 1, 4, 2,  3, 2, 4, 1,  4, 3, 2, 1,  1, 2, 3, 4], float),
    "random":      np.array([4, 3, 2, 1] * 4, float),  # perfect by chance: never a control
}


def test_the_paired_difference_of_three_hand_computed_prompts_is_exact():
    row = at_check(SCORES, CORRECT, GROUP, np.arange(4), n_boot=500, seed=3)
    assert (row["mixed_prompts"], row["excluded_prompts"]) == (3, 1)
    assert row["best_non_learned"] == "hidden_norm"  # 0.583 > confidence's 0.5; random is no signal
    conf, best = row["auroc_diff"]["mlp"]["confidence"], row["auroc_diff"]["mlp"]["best_non_learned"]
    assert conf["diff"] == (0.5 + 0.5 + 0.25) / 3 and (conf["prompts"], conf["excluded"]) == (3, 1)
    assert best["diff"] == (0.75 + 0.25 + 0.0) / 3
    # one implementation: the bootstrap CI of the per-prompt differences, seeded
    assert conf["ci"] == list(bootstrap_ci([0.5, 0.5, 0.25], n=500, seed=3))
    assert conf["ci"][0] <= conf["diff"] <= conf["ci"][1]
    assert conf["ci"][0] >= 0.25  # mlp leads confidence on every prompt: 0 is outside
    assert best["ci"][0] <= 0 <= best["ci"][1]  # a tie on prompt 2: not distinguishable
    assert at_check(SCORES, CORRECT, GROUP, np.arange(4), n_boot=500, seed=3) == row
    assert set(row["auroc_diff"]) == {"mlp"} and "conf_features" not in row["auroc_diff"]["mlp"]


def test_dominance_on_every_prompt_excludes_zero_and_a_coin_flip_does_not():
    rng = np.random.default_rng(0)
    b = rng.random(40)
    better = paired_difference(b + 0.01 + 0.1 * rng.random(40), b, n=1000, seed=1)
    assert better["ci"][0] > 0 and better["prompts"] == 40 and better["excluded"] == 0
    noise = paired_difference(b + rng.normal(0, 0.1, 40) - 0.01, b, n=1000, seed=1)
    assert noise["ci"][0] < 0 < noise["ci"][1]
    # NaN on either side (a prompt with no AUROC) is left out of both, and counted
    some = paired_difference([0.9, np.nan, 0.8, 0.7], [0.5, 0.6, np.nan, 0.6], n=200, seed=0)
    assert some["diff"] == pytest.approx(0.25, abs=1e-15) and (some["prompts"], some["excluded"]) == (2, 2)
    none = paired_difference([np.nan], [0.5])
    assert np.isnan(none["diff"]) and np.isnan(none["ci"]).all() and none["prompts"] == 0


def test_by_prefix_lists_every_position_and_names_the_best_signal_at_each():
    scores = {m: np.r_[s, -s] for m, s in SCORES.items()}  # position 8 reverses every ranking
    out = by_prefix(scores, np.r_[CORRECT, CORRECT], np.r_[GROUP, GROUP],
                    np.repeat([4, 8], len(GROUP)), n_boot=200, seed=0)
    assert out["positions"] == [4, 8] and out["mixed_prompts"] == [3, 3]
    conf = out["auroc_diff"]["mlp"]["confidence"]
    assert conf["diff"][0] == (0.5 + 0.5 + 0.25) / 3 and conf["diff"][1] == -conf["diff"][0]
    assert len(conf["ci"]) == 2 and conf["ci"][1][1] < 0  # reversed: mlp falls behind everywhere
    assert out["best_non_learned"] == ["hidden_norm", "confidence"]
    assert by_prefix({"confidence": scores["confidence"]}, CORRECT, GROUP, GROUP, 10, 0) == {}
    assert is_probe("mlp") and is_probe("linear@15") and not is_probe("conf_features")


def test_a_tiny_evaluate_run_reports_the_paired_statistics(small_bank, tmp_path, capsys):
    fast = [*small_bank, "evaluate.n_points=[4,8]", "evaluate.retention=[2,4]", "policy.keep=4",
            "evaluate.bootstrap=100", "train.epochs=3", "evaluate.text_metrics=false",
            "evaluate.methods=[confidence,hidden_norm,entropy,conf_features,mlp]"]
    train_with_controls(validate(compose("train", fast)), progress=False)
    run_stage("evaluate", [*fast, f"hydra.run.dir={tmp_path}"])
    m = json.loads((tmp_path / "metrics.json").read_text())
    paired, methods = m["paired"], m["methods"]
    assert {"bootstrap", "seed", "level", "prompts", "checks", "accuracy_diff",
            "accuracy_best_non_learned"} <= set(paired) and paired["bootstrap"] == 100
    check = paired["checks"][0]
    assert check["tokens"] == m["protocol"]["check_tokens"] and check["k"] == 4
    assert check["mixed_prompts"] + check["excluded_prompts"] == m["protocol"]["prompts"] == 6
    assert check["best_non_learned"] in ("confidence", "hidden_norm", "entropy")
    for role in ("confidence", "conf_features", "best_non_learned"):
        d, a = check["auroc_diff"]["mlp"][role], paired["accuracy_diff"]["mlp"][role]
        control = check["best_non_learned"] if role == "best_non_learned" else role
        # the mean of the per-prompt differences is the difference of the means, up to the
        # rounding of two means of <= 6 values in [0, 1] (a few ulps of 1)
        assert d["diff"] == pytest.approx(methods["mlp"]["auroc"] - methods[control]["auroc"], abs=1e-12)
        assert a["diff"] == pytest.approx(methods["mlp"]["accuracy"] - methods[control]["accuracy"],
                                          abs=1e-12)
        assert d["ci"][0] <= d["diff"] <= d["ci"][1] and a["ci"][0] <= a["diff"] <= a["ci"][1]
    prefix = m["paired_by_prefix"]
    n = len(prefix["positions"])
    assert n == len(m["auroc_by_prefix"]["mlp"]["positions"]) and n >= 2
    assert {len(prefix["auroc_diff"]["mlp"]["confidence"][k]) for k in ("diff", "ci")} == {n}
    assert prefix["mixed_prompts"] == m["auroc_by_prefix"]["mlp"]["n_mixed_prompts"]
    printed = capsys.readouterr().out
    assert "\n".join(paired_lines(m)) in printed and "mlp - best non-learned" in printed
    assert (tmp_path / "paired.png").exists() and m["plots"]["paired"].endswith("paired.png")
