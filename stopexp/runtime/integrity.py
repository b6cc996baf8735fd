"""Integrity of written artifacts: per-file records (size, SHA-256, a sampled digest of
large files) checked on load, and the removal of a damaged artifact without leaving half
of it under its name.

A record is taken when the artifact is written; a consumer compares the files with it
before use, cheaply (sizes; small files whole; 17 sampled blocks of large ones) or fully,
so that a truncated or garbled file is named, instead of surfacing as a bare library error
or as silently wrong numbers.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

SMALL_FILE = 4 << 20  # files up to this size are checksummed whole on every check
SPOT_BLOCK, SPOT_COUNT = 4096, 17  # larger ones: 17 evenly spaced 4 KiB blocks (ends included)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def spot_sha256(path: Path, size: int) -> str:
    """SHA-256 of SPOT_COUNT evenly spaced blocks (first and last included): reads 68 KiB
    whatever the size, and catches truncation, a rewritten head or tail, and garbling of
    any stretch longer than a sixteenth of the file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for k in range(SPOT_COUNT):
            f.seek(max(0, size - SPOT_BLOCK) * k // (SPOT_COUNT - 1))
            h.update(f.read(SPOT_BLOCK))
    return h.hexdigest()


def file_record(path: Path) -> dict:
    """{"size", "sha256"} of a file, plus "spot" (sampled digest) for a large one."""
    size = Path(path).stat().st_size
    rec = {"size": size, "sha256": file_sha256(path)}
    if size > SMALL_FILE:
        rec["spot"] = spot_sha256(path, size)
    return rec


def records(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """file name -> record, for every plain file of `directory` (not recursive)."""
    return {p.name: file_record(p) for p in sorted(Path(directory).iterdir())
            if p.is_file() and p.name not in skip}


def file_problem(path: Path, rec: dict, full: bool = False) -> str | None:
    """Why `path` differs from its record, or None. Cheap unless `full` (every byte)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name} is missing"
    if size != rec["size"]:
        return f"{path.name} has {size} bytes, {rec['size']} recorded (truncated or replaced)"
    if full or "spot" not in rec:
        same = file_sha256(path) == rec["sha256"]
    else:
        same = spot_sha256(path, size) == rec["spot"]
    return None if same else f"{path.name} differs from its recorded SHA-256 (garbled)"


def dir_problem(directory: Path, recs: dict[str, dict], full: bool = False) -> str | None:
    """Every recorded file of `directory` checked; the problems joined, or None."""
    problems = [file_problem(Path(directory) / name, rec, full) for name, rec in recs.items()]
    return "; ".join(p for p in problems if p) or None


def set_aside(path: Path) -> None:
    """Delete a damaged artifact directory: first renamed to a hidden name beside it (atomic,
    so no reader finds half of it under its name), then removed. When a concurrent process
    got there first, nothing is left to do."""
    path = Path(path)
    hidden = path.with_name(f".{path.name}.damaged-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, hidden)
    except FileNotFoundError:
        return
    shutil.rmtree(hidden, ignore_errors=True)
