"""How the Hydra entry points end on a user error (stopexp.errors): one `error:` line on
stderr and exit code 2, in place of Hydra's "Error executing job" and traceback.

    @hydra.main(config_path="../conf", config_name="train", version_base="1.3")
    @user_errors
    def main(cfg): ...

Hydra catches what a task function raises, so the report is made inside it. Hydra makes
the run dir before calling it: `OutputDirsCheck` (a callback in conf/common.yaml) checks
the output directories first, so an unwritable paths.output_dir is one line too.
"""
from __future__ import annotations

import functools
from pathlib import Path

from hydra.experimental.callback import Callback

from stopexp.errors import CannotWrite, reported


def user_errors(task):
    """Report a user error raised by a Hydra task function `task(cfg)` (see module doc)."""
    @functools.wraps(task)  # Hydra unwraps it to find the stage's module and conf/
    def job(cfg):
        with reported():
            try:
                return task(cfg)
            except CannotWrite as e:
                e.setting = e.setting or setting_of(cfg, e.path)
                raise
    return job


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
        from stopexp.config import check_output_dirs

        with reported():
            check_output_dirs(config)
