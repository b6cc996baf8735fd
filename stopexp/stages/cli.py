"""Every stage's entry point, `stage_main`: what each `python -m stopexp.<stage>` does
around its recipe, in one place.

    @stage_main("train")
    def main(stage: Stage) -> dict:     # the recipe: build objects, run, report
        return {"train": train(stage.cfg, stage.run, stage.overrides, stage.run_dir)}

In order: the command line is composed once (`stopexp.runtime.overrides.check_overrides`;
in a multirun every job of the sweep, validated too), so that a bad override is one
`error:` line; Hydra composes the config and makes the run dir (`OutputDirsCheck`, a
callback in conf/common.yaml, checks the output directories and the run or sweep dir
first); then the config is validated (with the keys set on the command line:
`check_unread_overrides`), the output directories checked, the tracked run
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
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from stopexp.config import check_output_dirs, validate
from stopexp.config.paths import probe_writable
from stopexp.config.ranges import fail
from stopexp.config.limits import check_bool_overrides
from stopexp.config.reads import check_unread_overrides
from stopexp.core.errors import CannotWrite, NotMade, reported
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
            check_bool_overrides(cfg, hc.overrides.task)  # before OmegaConf's true for 2 is read
            validate(cfg, hc.runtime)  # with the option files that Hydra composed it from
            check_unread_overrides(cfg, hc.overrides.task)
            check_output_dirs(cfg)
            # the repair commands a stage prints compose the same config: with its search path
            searchpath = [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath=")]
            stage = Stage(cfg, Path(hc.runtime.output_dir), [*hc.overrides.task, *searchpath])
            try:
                with build.tracked(cfg, config_name) if tracked else nullcontext() as run:
                    stage.run = run
                    metrics = recipe(stage)
                    if metrics is not None:
                        write_json(stage.run_dir / "metrics.json", metrics)  # before tracking's last calls
            except NotMade as e:  # the command that makes it, with this command line's overrides
                if e.overrides is None:
                    e.overrides = stage.overrides
                raise
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
        def main(checked: bool = False):
            """`checked`: the command line was checked already (stopexp.runtime.entry)."""
            if not checked:
                with reported():
                    check_overrides(config_name, sys.argv[1:])
            return run()
        return main
    return decorate


def setting_of(cfg, path: str) -> str | None:
    """The key whose directory holds `path` (the innermost one), if any: paths.output_dir,
    paths.cache_dir, or the run dir (hydra.run.dir, a sweep's job: hydra.sweep.dir)."""
    dirs = {f"paths.{k}": cfg.paths[k] for k in ("output_dir", "cache_dir")}
    if HydraConfig.initialized():
        hc = HydraConfig.get()
        dirs["hydra.sweep.dir" if hc.mode == RunMode.MULTIRUN else "hydra.run.dir"] = hc.runtime.output_dir
    inside = [(len(Path(d).parts), key) for key, d in dirs.items() if Path(path).is_relative_to(d)]
    return max(inside)[1] if inside else None


class OutputDirsCheck(Callback):
    """Before Hydra makes the run or sweep dir: paths.output_dir, paths.cache_dir and the run
    dir (hydra.run.dir) or sweep dir (hydra.sweep.dir), where Hydra writes the job's
    config, log and the stage's metrics.json and plots, can be written
    (stopexp.config.check_output_dirs), else one line naming the key."""

    def on_run_start(self, config, **kwargs) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config, **kwargs) -> None:
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config, run_key: str) -> None:
        with reported():
            check_output_dirs(config)
            # resolved once: Hydra reads the same value (stopexp_run_id is cached per config)
            where = Path(str(OmegaConf.select(config, run_key)))
            try:
                probe_writable(where)
            except OSError as e:
                fail(run_key, f"cannot write to {where} ({e.strerror or e}); point {run_key} at "
                              "a writable directory")
