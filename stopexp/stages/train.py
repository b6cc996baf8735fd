"""Stage 2, train: fit the signal predictor on the trace bank, the LM frozen (not loaded,
except by the super-token predictor, which runs it).

    python -m stopexp.train +exp=toy_contrastive

Reads the bank made by collect for the same upstream config (found by hash) joined with
its features (made by featurize, or tapped by collect), trains on the `train` split (its
first `train.max_prompts` prompts where set, `train_prompts` in the metrics) at
checkpoint `train.checkpoint` (or, with
`train.positions=all`, at every stored position: stopexp/training/per_step.py), early-stops on the
validation within-prompt AUROC (averaged over positions), keeps the best epoch, reports
train/val/test metrics with the AUROC at every stored position (`auroc_by_prefix`,
plotted) and saves a checkpoint that evaluate finds by hash. Then it trains the controls
evaluate scores beside it (`stopexp.stages.build.controls`: the other predictors of
evaluate.methods, and under train.positions=all the single-checkpoint predictor).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from stopexp.config.machine import prefix_cache_budget
from stopexp.core.names import lookup, runs_the_lm
from stopexp.core.policies import selection_share
from stopexp.core.protocol import checkpoint_tokens
from stopexp.runtime.artifacts import artifact_lock
from stopexp.signals import build_predictor
from stopexp.signals.saved_predictor import save_predictor
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.store import bank
from stopexp.store import feature_sets
from stopexp.training.data import check_reward_range, pair_min_gap, train_prompts, trained_on
from stopexp.training.per_step import position_rows
from stopexp.training.predictor import fit_and_score, prefix_curve, report, trained_checkpoint
from stopexp.training.selection import hold_out_for_selection

log = logging.getLogger(__name__)


def train(cfg, run=None, overrides: list[str] | None = None, run_dir: Path | None = None,
          progress: bool = True) -> dict:
    """Train (or find) the predictor of `cfg`; returns its metrics and checkpoint path."""
    features = build.feature_set(cfg)
    root = bank.require_bank(features.bank, overrides)
    meta = bank.read_meta(root)
    spec = feature_sets.spec_of(cfg.tap.layers, meta)
    out = build.predictor_dir(cfg, features)
    lm_based = runs_the_lm(cfg.predictor.name)
    with artifact_lock(out):  # concurrent trainers of this predictor take turns: the later find it
        if out.exists():
            # features replaced under the key (another tap, width or bank) are refused here as
            # evaluate refuses them, not passed over with the cached predictor
            feature_sets.require_features(features, overrides)
            found = trained_checkpoint(out, spec, cfg.predictor, trained_on(features), lm_based)
            if found is not None:
                return found
        start = time.time()
        every_position = cfg.train.positions == "all"
        data = build.training_data(cfg, features, meta, overrides, prefixes=lm_based)
        # the bank's train prompts given to training: the first train.max_prompts, or all
        n_prompts = train_prompts(bank.load_bank(root, "train"), cfg.train.max_prompts)
        check_reward_range(cfg.loss, cfg.reward.name, data)
        # policy=risk: the epoch is picked on training prompts, so no calibration prompt shapes it
        data = hold_out_for_selection(data, selection_share(cfg.policy), pair_min_gap(cfg.loss))
        fingerprint = trained_on(features)  # of the artifacts just read
        torch.manual_seed(cfg.train.seed)
        if lm_based:
            predictor = lookup("lm_predictor", cfg.predictor.name)(
                cfg.predictor, *build.lm(cfg, progress=False), cfg.search.max_batch_rows)
            predictor.keep_prefixes(*prefix_cache_budget(cfg.train.prefix_cache_gb, predictor.stop.device))
        else:
            predictor = build_predictor(cfg.predictor, spec)
            predictor.fit_inputs(data["train"])  # predictor.pca_components: on training rows only
        metrics, scores, history = fit_and_score(predictor, cfg.predictor.name, data, cfg.train,
                                                 cfg.loss, start, progress)
        metrics["train_prompts"] = n_prompts
        if lm_based and predictor.prefixes is not None:  # whether the prefixes fitted
            kept = predictor.prefixes
            log.info("kept the K/V of %d prefixes across epochs: %.2f of %.2f GiB (train.prefix_cache_gb)%s",
                     len(kept.rows), kept.bytes / 2**30, kept.budget / 2**30,
                     f"; stopped at {kept.reserve / 2**30:.1f} GiB free, the reserve for training"
                     if kept.at_reserve else "")
        if not every_position and not lm_based:  # the checkpoint's predictor at every position
            for split in data:
                metrics[split]["auroc_by_prefix"] = prefix_curve(
                    predictor, position_rows(features, split, overrides)[1])
        save_predictor(out, predictor, cfg.predictor, spec, root.name, metrics,
                       {"history": history, "trained_on": fingerprint, "checkpoint_tokens":
                        checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)})
    metrics["checkpoint"] = str(out)
    report(metrics, history, scores, data, cfg.predictor.name, every_position, out, root.name,
           run, run_dir)
    return metrics


def train_with_controls(cfg, run=None, overrides: list[str] | None = None,
                        run_dir: Path | None = None, progress: bool = True) -> dict:
    """Train (or find) the predictor of `cfg`, then the controls evaluate scores beside it
    (build.controls); its metrics, with "controls": label -> the control's checkpoint and
    test AUROC."""
    metrics = train(cfg, run, overrides, run_dir, progress)
    controls = {}
    for label, sub in build.controls(cfg).items():
        log.info("training the control %s (evaluate scores it beside %s)", label, cfg.predictor.name)
        got = train(sub, overrides=overrides, progress=False)
        controls[label] = {"checkpoint": got["checkpoint"], "test_auroc": got.get("test", {}).get("auroc")}
    return {**metrics, "controls": controls} if controls else metrics


@stage_main("train")
def main(stage: Stage) -> dict:
    metrics = train_with_controls(stage.cfg, stage.run, stage.overrides, stage.run_dir)
    for split in ("train", "val", "test"):
        if split in metrics:
            m = metrics[split]
            log.info("%-5s AUROC within-prompt %.3f  pooled %.3f  AUPRC %.3f  ECE %.3f  "
                     "Brier %.3f  length corr %+.3f", split, m["auroc"], m["auroc_pooled"],
                     m["auprc"], m["ece"], m["brier"], m["length_corr"])
            if "spearman_within" in m:  # a continuous reward
                log.info("%-5s reward %.4f  within-prompt Spearman %+.3f  Kendall %+.3f  AUROC above "
                         "median %.3f", split, m["mean_reward"], m["spearman_within"],
                         m["kendall_within"], m["auroc_above_median"])
    for warning in metrics.get("warnings", []):
        log.warning("%s", warning)
    plotted = sorted(p.name for p in stage.run_dir.glob("*.png"))  # none when already trained
    log.info("metrics.json%s in %s", f" and {', '.join(plotted)}" if plotted else "", stage.run_dir)
    return {"train": metrics}
