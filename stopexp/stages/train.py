"""Stage 2, train: fit the signal predictor on the trace bank, the LM frozen (not loaded,
except by the super-token predictor, which runs it).

    python -m stopexp.train +exp=toy_contrastive

Reads the bank made by collect for the same upstream config (found by hash) joined with
its features (`stopexp.store.features`, extracted here from the bank when missing: the LM is
loaded only then), trains on the `train` split at checkpoint `train.checkpoint` (or, with
`train.positions=all`, at every stored position: stopexp/training/per_step.py), early-stops on the
validation within-prompt AUROC (averaged over positions), keeps the best epoch, reports
train/val/test metrics with the AUROC at every stored position (`auroc_by_prefix`,
plotted) and saves a checkpoint that evaluate finds by hash.
"""
from __future__ import annotations

import logging

from stopexp.stages.cli import Stage, stage_main
from stopexp.training.predictor import train

log = logging.getLogger(__name__)


@stage_main("train")
def main(stage: Stage) -> dict:
    metrics = train(stage.cfg, stage.run, stage.overrides, stage.run_dir)
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
