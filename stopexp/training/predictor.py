"""A predictor's training once its data is loaded: the saved checkpoint while it still
fits (`trained_checkpoint`), the fit and the metrics of its scores (`fit_and_score`), and
the figures and tracked records of the run (`report`). The recipe that builds the data and
the predictor is the train stage (stopexp/stages/train.py)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from stopexp.evaluation import plots
from stopexp.metrics import is_binary
from stopexp.metrics.ranking import auroc_by_position
from stopexp.models.super_token import checkpoint_meta
from stopexp.runtime.integrity import set_aside
from stopexp.runtime.threads import one_thread
from stopexp.signals.saved_predictor import (CheckpointDamaged, CheckpointMismatch, CheckpointStale,
                                        load_predictor)
from stopexp.training.fit import evaluate_scores, fit, learning_warnings, score

log = logging.getLogger(__name__)


def trained_checkpoint(out: Path, spec, predictor_cfg, fingerprint: dict,
                       lm_based: bool) -> dict | None:
    """The metrics and path of the predictor saved at `out` when it fits `spec`, the
    predictor section and the data it learns from (`fingerprint`: trained_on), else None,
    a stale, damaged or misfitting checkpoint set aside to be retrained."""
    try:
        if lm_based:
            saved = checkpoint_meta(out, spec, predictor_cfg, fingerprint)
        else:
            _, saved = load_predictor(out, spec, predictor_cfg, fingerprint)
        log.info("predictor already trained for this config: %s", out)
        return {"checkpoint": str(out), **saved["metrics"]}
    except CheckpointStale as e:  # a bank re-collected or features re-made under the key
        log.warning("predictor %s %s: retraining it on the data now there", out, e.why)
        set_aside(out)
    except (CheckpointDamaged, CheckpointMismatch) as e:  # ours to rebuild: never loop
        log.warning("%s\nretraining it: the old checkpoint is deleted", e)
        set_aside(out)
    return None


def fit_and_score(predictor, name: str, data: dict, train, loss, start: float,
                  progress: bool = True) -> tuple[dict, dict, list[dict]]:
    """Fit `predictor` (named `name`, predictor.name) on `data` (split -> tensors) with the
    `train` and `loss` sections, keep its best epoch, and score every split; returns
    (metrics, split -> scores, per-epoch history). `start`: time.time() before the data
    was loaded (metrics' wall_s)."""
    n_params = sum(p.numel() for p in predictor.parameters())
    log.info("training %s (%d parameters) with %s on %d paths of %d prompts", name,
             n_params, loss.name, len(data["train"]["correct"]),
             len(set(data["train"]["group"].tolist())))
    with one_thread(predictor):  # the same weights whatever the machine's thread count
        best, history = fit(predictor, data, train, loss, progress)
    warnings = learning_warnings(best, [p for p in predictor.parameters() if p.requires_grad],
                                 "auroc" if is_binary(data["val"].get("reward", data["val"]["correct"]).numpy())
                                 else "spearman")
    for w in warnings:
        log.warning("%s: %s", name, w)
    predictor.load_state_dict(best["state"])
    metrics = {"predictor": name, "loss": loss.name, "parameters": n_params,
               "best_epoch": best["epoch"], "epochs": len(history),
               "val_auroc_untrained": best["init_auroc"], "warnings": warnings,
               "wall_s": round(time.time() - start, 2)}
    scores = {}
    for split, d in data.items():
        with one_thread(predictor):
            scores[split] = score(predictor, d)
        metrics[split] = evaluate_scores(scores[split], d)
    return metrics, scores, history


def prefix_curve(predictor, rows: dict) -> dict:
    """The predictor's within-prompt AUROC at every stored position of the position batch
    `rows` (stopexp.metrics.ranking.auroc_by_position)."""
    with one_thread(predictor):
        return auroc_by_position(score(predictor, rows), rows["correct"], rows["group"],
                                          rows["position"])


def report(metrics: dict, history: list[dict], scores: dict, data: dict, name: str,
           every_position: bool, out: Path, bank_name: str, run=None,
           run_dir: Path | None = None) -> None:
    """The loss curve, score histogram, reliability diagram and AUROC-by-prefix figures
    into `run_dir`, and, with a tracked `run`, the history, figures, summary and artifacts
    (the predictor at `out`, trained on the bank `bank_name`)."""
    if run_dir is not None:
        figs = {"loss_curve": plots.loss_curve(history, run_dir / "loss_curve.png")}
        split = "test" if "test" in data else "val"
        s, y = scores[split].numpy(), data[split]["correct"].numpy()
        figs["score_hist"] = plots.score_histogram(
            s, y, run_dir / "score_hist.png", f"{name} ({split})")
        figs["reliability"] = plots.reliability_diagram(
            1 / (1 + np.exp(-s)), y, run_dir / "reliability.png", f"{name} ({split})")
        curves = {f"{name} ({sp})": metrics[sp]["auroc_by_prefix"]
                  for sp in ("val", "test") if "auroc_by_prefix" in metrics.get(sp, {})}
        if curves:
            figs["auroc_by_prefix"] = plots.plot_auroc_by_prefix(
                curves, run_dir / "auroc_by_prefix.png",
                f"trained at {'every position' if every_position else 'one checkpoint'}")
        if run is not None:
            for h in history:
                run.log({"train/loss": h["train_loss"],
                         **{f"val/{k[4:]}": v for k, v in h.items() if k.startswith("val_")}},
                        step=h["epoch"])
            run.log({f"plots/{k}": run.image(v) for k, v in figs.items()})
    if run is not None:
        run.use_artifact(f"traces-{bank_name}", type="trace_bank")
        run.summary_update({f"{split}/{k}": v for split in data for k, v in metrics[split].items()})
        run.log_artifact(out, name=f"predictor-{out.name}", type="predictor",
                         metadata={"bank": bank_name, **{k: v for k, v in metrics.items()
                                                         if not isinstance(v, dict)}})
