"""The OmegaConf resolvers that conf/ uses, registered once on import:

    ${stopexp_root:}                 the checkout (project_root), the root of paths.*
    ${model_name_of:PATH}            a model's display name from its hub id or directory
    ${stopexp_keep:N,CHECK_AT,POLICY}, ${stopexp_retention:N}, ${stopexp_n_points:N}
                                     the defaults derived from search.n_paths
                                     (stopexp.core.protocol.derived_*)
    ${stopexp_where_read:KEY,VALUE}  VALUE where the chosen option reads KEY, else its
                                     default (stopexp.config.reads.where_read)
    ${stopexp_run_id:}               the name of a Hydra run or sweep dir (`run_id`)

Run and sweep dirs (conf/common.yaml) are named by `${stopexp_run_id:}`: the local time to
the second plus the process id and 4 random hex digits, e.g. `2026-11-30_00-41-07_81234-9f3a`,
so two ranks of a SLURM launch, two evaluates or two sweeps started in the same second (on
one node or several) get their own dirs, and the names still sort by start time. The
resolver is cached per config (like Hydra's `${now:}`), and Hydra copies that cache into
every job of a sweep, so `hydra.run.dir`, `hydra.sweep.dir` and the W&B group named after
the sweep agree.
"""
from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from stopexp.config.reads import where_read
from stopexp.core.protocol import derived_keep, derived_n_points, derived_retention


def project_root() -> Path:
    """STOPEXP_ROOT, else the checkout holding this package, else the working directory."""
    if os.environ.get("STOPEXP_ROOT"):
        return Path(os.environ["STOPEXP_ROOT"]).resolve()
    here = Path(__file__).resolve().parents[2]  # <checkout>/stopexp/config/resolvers.py
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def model_name_of(path: Optional[str]) -> Optional[str]:
    """A model's display name from its hub id or directory: the last path component."""
    return Path(str(path).rstrip("/")).name if path else None


def run_id(pattern: str = "%Y-%m-%d_%H-%M-%S") -> str:
    """`time.strftime(pattern)` + `_<pid>-<4 hex digits>`; a fresh value at every call."""
    return f"{time.strftime(pattern)}_{os.getpid()}-{secrets.token_hex(2)}"


for _name, _fn in (("stopexp_root", lambda: str(project_root())), ("model_name_of", model_name_of),
                   ("stopexp_keep", derived_keep), ("stopexp_retention", derived_retention),
                   ("stopexp_n_points", derived_n_points), ("stopexp_where_read", where_read)):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _fn)
if not OmegaConf.has_resolver("stopexp_run_id"):
    OmegaConf.register_new_resolver("stopexp_run_id", run_id, use_cache=True)
