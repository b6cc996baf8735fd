"""Checks of the Hydra launcher before a sweep starts, registered as a Hydra callback in
conf/common.yaml, so a launcher that cannot work here fails with one line saying what
to do instead of the plugin's traceback."""
from __future__ import annotations

import shutil

from hydra.experimental.callback import Callback

from stopexp.core.errors import ConfigError, reported

SLURM_COMMANDS = ("sbatch", "srun")  # submitit submits with sbatch and probes for srun


class LauncherCheck(Callback):
    """Refuse `hydra/launcher=submitit_slurm` on a machine without the SLURM commands."""

    def on_multirun_start(self, config, **kwargs) -> None:
        message = slurm_problem(config.hydra.launcher.get("_target_", ""))
        if message:
            with reported():
                raise ConfigError(message)


def slurm_problem(launcher_target: str) -> str | None:
    """Why the SLURM launcher cannot submit from this machine, with the fix; None if it can
    (or if the launcher is another one)."""
    if "SlurmLauncher" not in launcher_target:
        return None
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if not missing:
        return None
    return (f"hydra/launcher=submitit_slurm: {' and '.join(missing)} not found on PATH, so this "
            "machine cannot submit SLURM jobs. Launch the sweep from the cluster's login node "
            "(where sbatch works), or run it here with hydra/launcher=joblib (local processes) "
            "or without a hydra/launcher override (one job after another).")
