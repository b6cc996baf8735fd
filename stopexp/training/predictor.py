"""Train the predictor of a config (or find it trained): the data, the loop, the
checkpoint, the metrics and the plots; what `python -m stopexp.train` runs, and what
evaluate calls for a control that is missing."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from stopexp.config import checkpoint_tokens
from stopexp.core.policies import selection_share
from stopexp.evaluation import plots
from stopexp.metrics import is_binary
from stopexp.models import load_lm
from stopexp.models.super_token import SuperTokenPredictor, checkpoint_meta
from stopexp.runtime.integrity import set_aside
from stopexp.runtime.threads import one_thread
from stopexp.signals import build_predictor
from stopexp.signals.checkpoint import (CheckpointDamaged, CheckpointMismatch, CheckpointStale,
                                        load_predictor, save_predictor)
from stopexp.store import bank
from stopexp.store import features as feature_bank
from stopexp.training import per_step
from stopexp.training.data import (check_reward_range, features_of, pair_min_gap, predictor_dir,
                                   split_data, trained_on)
from stopexp.training.fit import evaluate_scores, fit, learning_warnings, score
from stopexp.training.selection import hold_out_for_selection

log = logging.getLogger(__name__)


def train(cfg, run=None, overrides: list[str] | None = None, run_dir: Path | None = None,
          progress: bool = True) -> dict:
    """Train (or find) the predictor of `cfg`; returns its metrics and checkpoint path."""
    features = features_of(cfg)
    root = bank.require_bank(features.bank, overrides)
    meta = bank.read_meta(root)
    spec = feature_bank.spec_of(cfg.tap.layers, meta)
    out = predictor_dir(cfg)
    lm_based = cfg.predictor.name == "super_token"  # the one predictor that runs the LM
    if out.exists():
        # features replaced under the key (another tap, width or bank) are refused here as
        # evaluate refuses them, not passed over with the cached predictor
        feature_bank.require_features(features, overrides)
        try:
            if lm_based:
                saved = checkpoint_meta(out, spec, cfg.predictor, trained_on(cfg))
            else:
                _, saved = load_predictor(out, spec, cfg.predictor, trained_on(cfg))
            log.info("predictor already trained for this config: %s", out)
            return {"checkpoint": str(out), **saved["metrics"]}
        except CheckpointStale as e:  # a bank re-collected or features re-made under the key
            log.warning("predictor %s %s: retraining it on the data now there", out, e.why)
            set_aside(out)
        except (CheckpointDamaged, CheckpointMismatch) as e:  # ours to rebuild: never loop
            log.warning("%s\nretraining it: the old checkpoint is deleted", e)
            set_aside(out)
    start = time.time()
    every_position = cfg.train.positions == "all"
    if every_position:
        data = per_step.split_data_all(meta, cfg, overrides)
    else:
        data = split_data(root, meta, cfg, prefixes=lm_based, overrides=overrides)
    check_reward_range(cfg, data)
    data = hold_out_for_selection(data, selection_share(cfg.policy), pair_min_gap(cfg))
    fingerprint = trained_on(cfg)  # of the artifacts just read
    torch.manual_seed(cfg.train.seed)
    if lm_based:
        lm, tokenizer = load_lm(cfg.model, cfg.paths.cache_dir, cfg.task, cfg.tap, progress=False)
        predictor = SuperTokenPredictor(cfg.predictor, lm, tokenizer, cfg.search.max_batch_rows)
    else:
        predictor = build_predictor(cfg.predictor, spec)
    n_params = sum(p.numel() for p in predictor.parameters())
    log.info("training %s (%d parameters) with %s on %d paths of %d prompts", cfg.predictor.name,
             n_params, cfg.loss.name, len(data["train"]["correct"]),
             len(set(data["train"]["group"].tolist())))
    with one_thread(predictor):  # the same weights whatever the machine's thread count
        best, history = fit(cfg, predictor, data, progress)
    warnings = learning_warnings(best, [p for p in predictor.parameters() if p.requires_grad],
                                 "auroc" if is_binary(data["val"].get("reward", data["val"]["correct"]).numpy())
                                 else "spearman")
    for w in warnings:
        log.warning("%s: %s", cfg.predictor.name, w)
    predictor.load_state_dict(best["state"])
    metrics = {"predictor": cfg.predictor.name, "loss": cfg.loss.name, "parameters": n_params,
               "best_epoch": best["epoch"], "epochs": len(history),
               "val_auroc_untrained": best["init_auroc"], "warnings": warnings,
               "wall_s": round(time.time() - start, 2)}
    scores = {}
    for split, d in data.items():
        with one_thread(predictor):
            scores[split] = score(predictor, d)
        metrics[split] = evaluate_scores(scores[split], d)
        if not every_position and not lm_based:  # the checkpoint's predictor at every position
            _, rows = per_step.position_data(cfg, split, overrides)
            with one_thread(predictor):
                metrics[split]["auroc_by_prefix"] = per_step.auroc_by_position(
                    score(predictor, rows), rows["correct"], rows["group"], rows["position"])
    save_predictor(out, predictor, cfg.predictor, spec, root.name, metrics,
                   {"history": history, "trained_on": fingerprint, "checkpoint_tokens":
                    checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)})
    metrics["checkpoint"] = str(out)
    if run_dir is not None:
        figs = {"loss_curve": plots.loss_curve(history, run_dir / "loss_curve.png")}
        split = "test" if "test" in data else "val"
        s, y = scores[split].numpy(), data[split]["correct"].numpy()
        figs["score_hist"] = plots.score_histogram(
            s, y, run_dir / "score_hist.png", f"{cfg.predictor.name} ({split})")
        figs["reliability"] = plots.reliability_diagram(
            1 / (1 + np.exp(-s)), y, run_dir / "reliability.png", f"{cfg.predictor.name} ({split})")
        curves = {f"{cfg.predictor.name} ({sp})": metrics[sp]["auroc_by_prefix"]
                  for sp in ("val", "test") if "auroc_by_prefix" in metrics.get(sp, {})}
        if curves:
            figs["auroc_by_prefix"] = plots.auroc_by_prefix(
                curves, run_dir / "auroc_by_prefix.png",
                f"trained at {'every position' if every_position else 'one checkpoint'}")
        if run is not None:
            for h in history:
                run.log({"train/loss": h["train_loss"],
                         **{f"val/{k[4:]}": v for k, v in h.items() if k.startswith("val_")}},
                        step=h["epoch"])
            run.log({f"plots/{k}": run.image(v) for k, v in figs.items()})
    if run is not None:
        run.use_artifact(f"traces-{root.name}", type="trace_bank")
        run.summary_update({f"{split}/{k}": v for split in data for k, v in metrics[split].items()})
        run.log_artifact(out, name=f"predictor-{out.name}", type="predictor",
                         metadata={"bank": root.name, **{k: v for k, v in metrics.items()
                                                         if not isinstance(v, dict)}})
    return metrics
