"""A launcher that cannot work on this machine fails before the sweep, in one line."""
import os
import subprocess
import sys

from conftest import ROOT
from stopexp.runtime import launchers

SLURM = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


def test_slurm_launcher_without_sbatch_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(launchers.shutil, "which", lambda cmd: None)
    msg = launchers.slurm_problem(SLURM)
    assert msg.startswith("hydra/launcher=submitit_slurm: sbatch and srun not found on PATH")
    assert "cluster's login node" in msg and "hydra/launcher=joblib" in msg
    assert launchers.slurm_problem("hydra_plugins.hydra_joblib_launcher.JoblibLauncher") is None
    monkeypatch.setattr(launchers.shutil, "which", lambda cmd: f"/usr/bin/{cmd}")
    assert launchers.slurm_problem(SLURM) is None


def test_slurm_sweep_on_a_machine_without_slurm_prints_one_line_and_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))  # no SLURM commands
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-m", "stopexp.collect", "-m", "+exp=toy_contrastive",
                        "logger=none", "hydra/launcher=submitit_slurm",
                        f"paths.output_dir={tmp_path}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {launchers.slurm_problem(SLURM)}"]
    assert "Traceback" not in r.stderr + r.stdout
