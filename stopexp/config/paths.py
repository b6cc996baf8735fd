"""The paths and logger groups (conf/common.yaml, conf/logger/): where outputs and caches
go and where runs are tracked; and the check that the output locations can be written."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from stopexp.config.ranges import fail, get


@dataclass
class LoggerConfig:
    name: str = "wandb"        # wandb | none
    project: str = "stopexp"
    entity: Optional[str] = None
    mode: str = "offline"      # offline | online | disabled
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class PathsConfig:
    root: str = "${stopexp_root:}"
    output_dir: str = "${paths.root}/outputs"
    cache_dir: str = "${paths.output_dir}/cache"


def probe_writable(where: Path) -> None:
    """Make `where` if missing and write and remove a probe file in it; OSError if either
    fails (root may write where permissions say no, so asking os.access is not enough)."""
    import tempfile

    where.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=where, prefix=".write-probe-")
    os.close(fd)
    os.unlink(probe)


def check_output_dirs(cfg) -> None:
    """Every output location (paths.output_dir, paths.cache_dir) exists or can be made, and
    a file can be written in it; ConfigError names the key otherwise. Call before compute,
    so a read-only cache is found before the LM loads (`probe_writable`)."""
    for key in ("paths.output_dir", "paths.cache_dir"):
        where = Path(get(cfg, key))
        try:
            probe_writable(where)
        except OSError as e:
            fail(key, f"cannot write to {where} ({e.strerror or e}); point {key} at a writable "
                      "directory")
