"""Every stage's entry point, `stage_main`: what each `python -m stopexp.<stage>` does
around its recipe, in one place.

    @stage_main("train")
    def main(stage: Stage) -> dict:     # the recipe: build objects, run, report
        return {"train": train(stage.cfg, stage.run, stage.overrides, stage.run_dir)}

In order: the command line is composed once (`stopexp.runtime.overrides.check_overrides`),
so that a bad override is one `error:` line; Hydra composes the config and makes the run
dir (`OutputDirsCheck`, a callback in conf/common.yaml, checks the output directories
first); then the config is validated, the output directories checked, the tracked run
opened (tracking fails safe: the outputs never depend on it), the recipe run, its metrics
written to `<run dir>/metrics.json`, and, when `optimized_metric` is set (a Hydra sweeper's
trial), the objective returned; a trial that fails returns the worst value so the sweep
goes on. A user error (stopexp.core.errors) anywhere ends with one `error:` line on stderr
and exit code 2 (`user_errors`), in place of Hydra's "Error executing job" and traceback.
"""
from __future__ import annotations

import functools
import logging
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from stopexp.config import check_output_dirs, validate
from stopexp.core.errors import CannotWrite, reported
from stopexp.runtime.artifacts import write_json
from stopexp.runtime.overrides import CONF_DIR, check_overrides
from stopexp.runtime.sweeps import objective, worst_value
from stopexp.stages import build

log = logging.getLogger(__name__)


@dataclass
class Stage:
    """What a recipe is given: the validated config, the run dir, the command line's
    overrides (the repair commands a stage prints repeat them) and the tracked run (None
    for a stage that is not tracked)."""
    cfg: DictConfig
    run_dir: Path
    overrides: list[str]
    run: Any = None


def user_errors(task):
    """Report a user error raised by a Hydra task function `task(cfg)` (see module doc)."""
    @functools.wraps(task)  # Hydra unwraps it to find the stage's module
    def job(cfg):
        with reported():
            try:
                return task(cfg)
            except CannotWrite as e:
                e.setting = e.setting or setting_of(cfg, e.path)
                raise
    return job


def stage_main(config_name: str, tracked: bool = True):
    """The entry point of the stage whose config is conf/<config_name>.yaml, around
    `recipe(stage) -> metrics` (see module doc). `tracked=False`: the recipe opens its own
    tracked runs (or none); a recipe that returns None writes no metrics.json."""
    def decorate(recipe: Callable[[Stage], dict | None]):
        @functools.wraps(recipe)
        def task(cfg):
            hc = HydraConfig.get()
            validate(cfg, hc.runtime)  # with the option files that Hydra composed it from
            check_output_dirs(cfg)
            stage = Stage(cfg, Path(hc.runtime.output_dir), list(hc.overrides.task))
            try:
                with build.tracked(cfg, config_name) if tracked else nullcontext() as run:
                    stage.run = run
                    metrics = recipe(stage)
                    if metrics is not None:
                        write_json(stage.run_dir / "metrics.json", metrics)  # before tracking's last calls
            except Exception:
                if not cfg.get("optimized_metric"):
                    raise
                log.exception("trial failed; the sweeper gets the worst value and goes on")
                return worst_value()
            if cfg.get("optimized_metric"):  # for Hydra sweepers; NaN counts as the worst value
                return objective(metrics, cfg.optimized_metric)
            return metrics

        run = hydra.main(config_path=str(CONF_DIR), config_name=config_name,
                         version_base="1.3")(user_errors(task))

        @functools.wraps(run)
        def main():
            with reported():
                check_overrides(config_name, sys.argv[1:])
            return run()
        return main
    return decorate


def setting_of(cfg, path: str) -> str | None:
    """The paths.* key whose directory holds `path` (the innermost one), if any."""
    inside = [(len(Path(cfg.paths[k]).parts), f"paths.{k}") for k in ("output_dir", "cache_dir")
              if Path(path).is_relative_to(cfg.paths[k])]
    return max(inside)[1] if inside else None


class OutputDirsCheck(Callback):
    """Before Hydra makes the run or sweep dir: paths.output_dir and paths.cache_dir can be
    written (stopexp.config.check_output_dirs), else one line naming the key."""

    def on_run_start(self, config, **kwargs) -> None:
        self._check(config)

    def on_multirun_start(self, config, **kwargs) -> None:
        self._check(config)

    @staticmethod
    def _check(config) -> None:
        with reported():
            check_output_dirs(config)
