"""Experiment tracking: a W&B run (offline by default) or a null run with the same methods.

All W&B directories live under `<paths.output_dir>/wandb`, so nothing lands in the home
directory. `tracked_run` always finishes the run, marking it failed on error, so Hydra
multirun jobs never log into one another's run; the jobs of one sweep share a W&B group.

Tracking never costs a stage its outputs: a W&B failure (the service refuses to start,
wandb-core dies, a call raises, its directories cannot be made) is logged once as a warning and the run goes on as a
null run; the stage's exit code reflects only its own work.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)


class NullRun:
    """Same methods as a W&B run; does nothing (logger=none)."""

    name = "null"
    dir = None

    def log(self, data: dict, step: int | None = None) -> None:
        pass

    def log_artifact(self, path, name: str, type: str, metadata: dict | None = None,
                     aliases: list | None = None) -> None:
        pass

    def use_artifact(self, name: str, type: str | None = None) -> None:
        pass

    def summary_update(self, data: dict) -> None:
        pass

    def table(self, columns: list[str], rows: list[list]) -> Any:
        return None

    def image(self, path) -> Any:
        return None

    def finish(self, exit_code: int = 0) -> None:
        pass


def _fail_safe(method):
    """Run a WandbRun method; on any error warn once, turn the run into a null run (every
    later call does nothing, except `finish`, which is still tried) and return what the
    null run would."""
    null = getattr(NullRun, method.__name__)

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.broken and method.__name__ != "finish":
            return null(self, *args, **kwargs)
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001  (tracking must never end the stage)
            if not self.broken:
                log.warning("W&B %s failed (%s: %s); tracking is off for the rest of this "
                            "run, the stage's outputs are written as usual",
                            method.__name__, type(e).__name__, e)
            self.broken = True
            return null(self, *args, **kwargs)
    return wrapper


class WandbRun(NullRun):
    """A W&B run behind NullRun's methods; each fails safe (see the module docstring)."""

    def __init__(self, run, wandb):
        self._run, self._wandb = run, wandb
        self.name, self.dir = run.name, run.dir
        self.broken = False

    @_fail_safe
    def log(self, data: dict, step: int | None = None) -> None:
        self._run.log(data, step=step)

    @_fail_safe
    def log_artifact(self, path, name: str, type: str, metadata: dict | None = None,
                     aliases: list | None = None) -> None:
        art = self._wandb.Artifact(name=name, type=type, metadata=metadata or {})
        path = Path(path)
        if path.is_dir():
            art.add_reference(path.resolve().as_uri(), name=path.name)
        else:
            art.add_file(str(path))
        self._run.log_artifact(art, aliases=aliases)

    @_fail_safe
    def use_artifact(self, name: str, type: str | None = None) -> None:
        with contextlib.suppress(Exception):  # lineage only; absent upstream runs are fine
            self._run.use_artifact(f"{name}:latest", type=type)

    @_fail_safe
    def summary_update(self, data: dict) -> None:
        self._run.summary.update(data)

    @_fail_safe
    def table(self, columns: list[str], rows: list[list]) -> Any:
        return self._wandb.Table(columns=columns, data=rows)

    @_fail_safe
    def image(self, path) -> Any:
        return self._wandb.Image(str(path))

    @_fail_safe
    def finish(self, exit_code: int = 0) -> None:
        self._run.finish(exit_code=exit_code)


def wandb_dirs(output_dir: str | os.PathLike) -> Path:
    """Point every W&B directory inside the project's output folder; return the root."""
    root = Path(output_dir) / "wandb"
    for var, sub in [("WANDB_DIR", ""), ("WANDB_CACHE_DIR", ".cache"),
                     ("WANDB_DATA_DIR", ".data"), ("WANDB_CONFIG_DIR", ".config"),
                     ("WANDB_ARTIFACT_DIR", ".artifacts")]:
        path = root / sub if sub else root
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path)
    return root


def run_group(logger) -> str | None:
    """logger.group, else under Hydra multirun the sweep dir's name (one group per sweep)."""
    if logger.group:
        return logger.group
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():  # compose API, notebooks: no sweep
        return None
    hc = HydraConfig.get()
    return Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None


def start_run(logger, output_dir: str | os.PathLike, record: dict, job_type: str,
              name: str | None = None) -> NullRun:
    """A W&B run for the `logger` section, its directories under `output_dir`, recording
    `record` (the resolved config, plain) as the run's config; or a NullRun (logger=none,
    mode=disabled, or W&B could not start: then with a warning saying why, and the stage
    goes on)."""
    lg = logger
    if lg.name == "none" or lg.mode == "disabled":
        return NullRun()
    try:  # the W&B dirs too: one that is a file or read-only costs tracking, not outputs
        root = wandb_dirs(output_dir)
        import wandb

        run = wandb.init(project=lg.project, entity=lg.entity, mode=lg.mode, group=run_group(lg),
                         tags=list(lg.tags), job_type=job_type, name=name, dir=str(root),
                         config=record, reinit="create_new",
                         settings=wandb.Settings(silent=True, x_disable_stats=True))
        return WandbRun(run, wandb)
    except Exception as e:  # noqa: BLE001  (no tracking is better than no results)
        log.warning("W&B could not start a run (%s: %s); going on without tracking "
                    "(logger=none silences this)", type(e).__name__, e)
        return NullRun()


@contextlib.contextmanager
def tracked_run(logger, output_dir: str | os.PathLike, record: dict, job_type: str,
                name: str | None = None) -> Iterator[NullRun]:
    """A run (`start_run`) that is finished in all cases and marked failed (exit code 1) on error."""
    run = start_run(logger, output_dir, record, job_type, name)
    try:
        yield run
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish(exit_code=0)
