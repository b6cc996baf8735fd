"""The whole study on one config: collect -> featurize -> train -> evaluate, each stage reusing what
an earlier run already made for the same upstream config (found by hash).

    python -m stopexp.pipeline +exp=toy_contrastive
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from stopexp.runtime.artifacts import write_json
from stopexp.runtime.cli import stage_main
from stopexp.config import check_output_dirs, validate
from stopexp.runtime.tracking import tracked_run

log = logging.getLogger(__name__)


def run_pipeline(cfg, run_dir: Path) -> dict:
    from stopexp.stages.collect import collect
    from stopexp.stages.evaluate import evaluate, print_table
    from stopexp.store.features import featurize
    from stopexp.stages.train import train

    timings, start = {}, time.time()
    with tracked_run(cfg, "pipeline") as run:
        collected = collect(cfg, run=run)
        timings["collect_s"] = round(time.time() - start, 1)
        featurized = featurize(cfg, run=run)
        timings["featurize_s"] = round(time.time() - start - sum(timings.values()), 1)
        trained = train(cfg, run=run, run_dir=run_dir / "train")
        timings["train_s"] = round(time.time() - start - sum(timings.values()), 1)
        evaluated = evaluate(cfg, run=run, run_dir=run_dir / "evaluate")
        timings["evaluate_s"] = round(time.time() - start - sum(timings.values()), 1)
        timings["wall_s"] = round(time.time() - start, 1)
        metrics = {"collect": collected, "featurize": featurized, "train": trained, **evaluated,
                   "pipeline": timings}
        write_json(run_dir / "metrics.json", metrics)  # before tracking's last calls
        run.summary_update({f"pipeline/{k}": v for k, v in timings.items()})
    print(print_table(evaluated))
    for warning in trained.get("warnings", []):  # under the table, where it is read
        print(f"WARNING: predictor {trained.get('predictor')}: {warning}")
    return metrics


def where_outputs(run_dir: Path) -> str:
    """Where this run's files are: metrics.json in the run dir, each stage's plots in its
    subdir (train makes none when it found the predictor already trained)."""
    parts = [f"metrics.json in {run_dir}"]
    for stage in ("evaluate", "train"):
        if any((run_dir / stage).glob("*.png")):
            parts.append(f"{stage}'s plots in {run_dir / stage}")
    return ", ".join(parts)


@stage_main("pipeline")
def main(cfg: DictConfig) -> float | None:
    validate(cfg)
    check_output_dirs(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    from stopexp.runtime.sweeps import objective, worst_value

    try:
        metrics = run_pipeline(cfg, run_dir)
    except Exception:
        if not cfg.optimized_metric:
            raise
        # a sweeper's trial: one crash must not end the whole sweep
        log.exception("trial failed; the sweeper gets the worst value and goes on")
        return worst_value()
    log.info("done in %.0f s; %s", metrics["pipeline"]["wall_s"], where_outputs(run_dir))
    if cfg.optimized_metric:  # for Hydra sweepers; NaN counts as the worst value
        return objective(metrics, cfg.optimized_metric)
    return None


if __name__ == "__main__":
    main()
