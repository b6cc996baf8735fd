"""Names of Hydra run and sweep dirs that two processes never share.

`${stopexp_run_id:}` (conf/common.yaml) is the local time to the second plus the process
id and 4 random hex digits, e.g. `2026-11-30_00-41-07_81234-9f3a`: two ranks of a SLURM
launch, two evaluates or two sweeps started in the same second (on one node or several)
get their own dirs, and the names still sort by start time. The resolver is cached per
config (like Hydra's `${now:}`), and Hydra copies that cache into every job of a sweep, so
`hydra.run.dir`, `hydra.sweep.dir` and the W&B group named after the sweep agree.
"""
from __future__ import annotations

import os
import secrets
import time

from omegaconf import OmegaConf


def run_id(pattern: str = "%Y-%m-%d_%H-%M-%S") -> str:
    """`time.strftime(pattern)` + `_<pid>-<4 hex digits>`; a fresh value at every call."""
    return f"{time.strftime(pattern)}_{os.getpid()}-{secrets.token_hex(2)}"


if not OmegaConf.has_resolver("stopexp_run_id"):
    OmegaConf.register_new_resolver("stopexp_run_id", run_id, use_cache=True)
