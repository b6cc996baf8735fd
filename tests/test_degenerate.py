"""A run whose result is degenerate fails or says so: train never keeps a diverged epoch
(a non-finite loss, validation score or weight) and fails in one line when no epoch is
finite, writing no predictor; evaluate ends with a warning, in the log and in
`metrics.json`, when a method pruned every path of a prompt or scored with non-finite
values."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from conftest import compose, run_stage
from stopexp.config import validate
from stopexp.evaluation.accounting import outcome
from stopexp.evaluation.degenerate import degenerate_warnings
from stopexp.stages import build
from stopexp.store.path_table import Paths


@pytest.mark.parametrize("early", ["true", "false"])
def test_a_diverged_train_fails_in_one_line_and_saves_no_predictor(early, small_bank, tmp_path, capsys):
    overrides = [*small_bank, "train.lr=1e30", "train.epochs=3", f"train.early_stopping={early}"]
    out = build.predictor_dir(cfg := validate(compose("train", overrides)), build.feature_set(cfg))
    with pytest.raises(SystemExit) as e:
        run_stage("train", [*overrides, f"hydra.run.dir={tmp_path}"])
    assert e.value.code == 2 and not out.exists() and not (tmp_path / "metrics.json").exists()
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: train.lr: 1e+30 diverged: no epoch of ")
    assert line.endswith("so no predictor is saved; allowed: a smaller train.lr")


def test_step_pruning_every_path_ends_with_a_warning(small_bank, tmp_path, capsys):
    """STEP under a KV budget of one token prunes every path of every prompt: the run
    ends, and says so in the log, under the table and in metrics.json."""
    step = [*small_bank, "tap.positions.step_ends=true", "evaluate.methods=[step]",
            "evaluate.stopping.step.signal=confidence", "engine.kv_budget=1",
            "evaluate.text_metrics=false", "evaluate.bootstrap=20"]
    run_stage("featurize", [*step, f"hydra.run.dir={tmp_path / 'featurize'}"])
    run_stage("evaluate", [*step, f"hydra.run.dir={tmp_path / 'evaluate'}"])
    metrics = json.loads((tmp_path / "evaluate" / "metrics.json").read_text())
    prompts = 6  # the small bank's collect.prompts.test
    assert metrics["methods"]["step"]["accuracy"] == 0.0
    warning = (f"step: every path was pruned in {prompts} of {prompts} prompts, so they have no "
               "answer to vote and count as wrong; its settings prune too much for this run "
               "(a threshold, a budget)")
    assert metrics["warnings"] == [warning]
    assert f"WARNING: {warning}" in capsys.readouterr().out


def test_a_scored_method_that_prunes_every_path_and_nan_scores_warn(caplog):
    """A threshold that keeps no path of a prompt (`outcome`, every scored method's) and
    scores that are NaN or infinite: one warning each, logged."""
    paths = Paths(group=np.repeat([0, 1], 2), path_id=np.tile([0, 1], 2), length=np.full(4, 9),
                  correct=np.array([1, 0, 1, 1], bool), answer=np.array(["7", "3", "7", "7"], object),
                  text=np.array([f"p{i}" for i in range(4)], object), alive=np.ones(4, bool), batch={})
    kept = np.array([False, False, True, False])  # prompt 0 keeps none of its paths
    o = outcome(paths, kept, 5, 2)
    assert o["no_path_left"].tolist() == [True, False] and o["correct"].tolist() == [False, True]
    with caplog.at_level(logging.WARNING):
        found = degenerate_warnings({"mlp": o}, {"mlp": np.array([0.1, np.nan, np.inf, 0.2])})
    assert found == [
        "mlp: every path was pruned in 1 of 2 prompts, so they have no answer to vote and count "
        "as wrong; its settings prune too much for this run (a threshold, a budget)",
        "mlp: 2 of 4 scores at the check are NaN or infinite (NaN ranks lowest, pruned first; "
        "+-inf at the extremes): its predictor diverged or its inputs are not finite"]
    assert [r.getMessage() for r in caplog.records] == found
    assert degenerate_warnings({"mlp": outcome(paths, np.ones(4, bool), 5, 2)},
                               {"mlp": np.zeros(4)}) == []


def test_adapt_updates_that_diverge_end_with_a_warning(small_bank, tmp_path):
    from stopexp.stages.adapt import adapt
    from stopexp.stages.train import train_with_controls

    overrides = ["adapt.stream_prompts=4", "adapt.heldout_prompts=2", "adapt.batch_prompts=2",
                 "adapt.steps=3", "adapt.variants=[frozen,kept_only]", "policy.keep=4",
                 "train.epochs=3"]
    cfg = validate(compose("adapt", [*small_bank, *overrides]))
    train_with_controls(cfg, progress=False)
    metrics = adapt(cfg, overrides=small_bank)
    assert metrics["warnings"] == []
    diverged = adapt(validate(compose("adapt", [*small_bank, *overrides, "adapt.lr=1e30"])),
                     overrides=small_bank)
    assert len(diverged["warnings"]) == 1 and diverged["warnings"][0].startswith(
        "kept_only: the online updates diverged from batch ")
    assert diverged["warnings"][0].endswith("so its later decisions rank paths by non-finite "
                                            "scores; allowed: a smaller adapt.lr")
