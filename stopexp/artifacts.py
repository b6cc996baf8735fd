"""Artifacts: content hashes of the configs that make them, and writes that never leave a
half-written file behind (write to a temporary name, then rename)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def plain(obj: Any) -> Any:
    if isinstance(obj, DictConfig) or OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
    return obj


def config_hash(*parts: Any, length: int = 12) -> str:
    """A stable hash of config sections (dicts, DictConfigs, scalars)."""
    blob = json.dumps([plain(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write JSON atomically: readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def publish_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written directory into place; a concurrent writer that got there first
    wins and this copy is dropped (both were made from the same config)."""
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp_dir, final_dir)
    except OSError:
        if not final_dir.exists():
            raise
        shutil.rmtree(tmp_dir, ignore_errors=True)


def staging_dir(final_dir: Path) -> Path:
    """A fresh temporary directory beside `final_dir` (same file system, so rename works)."""
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".{final_dir.name}.tmp-"))
