"""The whole study on one config: collect -> featurize -> train -> evaluate (after toy_lm for
the toy LM when it is missing), each stage reusing what an earlier run already made for the
same upstream config (found by hash). The one command that chains stages.

    python -m stopexp.pipeline +exp=toy_contrastive
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from stopexp.models.toy_lm import ensure_toy_lm
from stopexp.runtime.artifacts import write_json
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.stages.collect import collect
from stopexp.stages.evaluate import evaluate, print_table
from stopexp.stages.featurize import featurize
from stopexp.stages.train import train_with_controls

log = logging.getLogger(__name__)


def run_pipeline(cfg, run_dir: Path, overrides: list[str] | None = None) -> dict:
    """Each stage in turn; `overrides`, the command line's, go into the commands printed to
    repair an artifact."""
    timings, start = {}, time.time()
    with build.tracked(cfg, "pipeline") as run:
        if cfg.model.name == "toy":  # the toy_lm stage's model, trained when missing
            ensure_toy_lm(cfg.model.toy, cfg.task, cfg.paths.cache_dir)
        collected = collect(build.collection(cfg), run=run)
        timings["collect_s"] = round(time.time() - start, 1)
        featurized = featurize(build.feature_set(cfg), overrides, run=run)
        timings["featurize_s"] = round(time.time() - start - sum(timings.values()), 1)
        trained = train_with_controls(cfg, run, overrides, run_dir / "train")
        timings["train_s"] = round(time.time() - start - sum(timings.values()), 1)
        evaluated = evaluate(cfg, run, run_dir / "evaluate", overrides)
        timings["evaluate_s"] = round(time.time() - start - sum(timings.values()), 1)
        timings["wall_s"] = round(time.time() - start, 1)
        metrics = {"collect": collected, "featurize": featurized, "train": trained, **evaluated,
                   "pipeline": timings}
        write_json(run_dir / "metrics.json", metrics)  # before tracking's last calls
        run.summary_update({f"pipeline/{k}": v for k, v in timings.items()})
    print(print_table(evaluated))
    for warning in trained.get("warnings", []):  # under the table, where it is read
        print(f"WARNING: predictor {trained.get('predictor')}: {warning}")
    for warning in evaluated.get("warnings", []):
        print(f"WARNING: {warning}")
    return metrics


def where_outputs(run_dir: Path) -> str:
    """Where this run's files are: metrics.json in the run dir, each stage's plots in its
    subdir (train makes none when it found the predictor already trained)."""
    parts = [f"metrics.json in {run_dir}"]
    for stage in ("evaluate", "train"):
        if any((run_dir / stage).glob("*.png")):
            parts.append(f"{stage}'s plots in {run_dir / stage}")
    return ", ".join(parts)


@stage_main("pipeline", tracked=False)
def main(stage: Stage) -> dict:
    metrics = run_pipeline(stage.cfg, stage.run_dir, stage.overrides)
    log.info("done in %.0f s; %s", metrics["pipeline"]["wall_s"], where_outputs(stage.run_dir))
    return metrics
