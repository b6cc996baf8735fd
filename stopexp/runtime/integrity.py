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
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

SMALL_FILE = 4 << 20  # files up to this size are checksummed whole on every check
SPOT_BLOCK, SPOT_COUNT = 4096, 17  # larger ones: 17 evenly spaced 4 KiB blocks (ends included)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# a file whose times are this recent may still change within the same clock tick, leaving
# them as they are: its digest is not remembered (git's "racy" files)
RACY_NS = 2_000_000_000
_DIGESTS: dict[str, str] = {}  # identity -> SHA-256 (content_sha256)


def content_sha256(path: Path, store: Path | None = None) -> str:
    """The SHA-256 of a file the user may change in place (model weights, a tokenizer, a
    task's data), read once per version of the file: remembered in this process and, with
    `store` (a directory), across processes, under the file's identity: its resolved path,
    device, inode, size, and modification and status-change times in ns. Writing a file in
    place updates its ctime (which no tool sets back); a copy, even one that keeps the
    mtime (`cp -p`, rsync), has a new inode and ctime; so any change of the content changes
    the identity, and an unchanged file costs one stat."""
    path = Path(path).resolve()
    st = path.stat()
    identity = "\0".join(map(str, (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                    st.st_ctime_ns)))
    settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS
    entry = Path(store) / hashlib.sha256(identity.encode()).hexdigest() if store else None
    if settled and identity in _DIGESTS:
        return _DIGESTS[identity]
    if settled and entry is not None and entry.is_file():
        digest = entry.read_text().strip()
        if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
            _DIGESTS[identity] = digest
            return digest
    if st.st_size > 1 << 30:
        log.info("reading %s (%.1f GB) once for its content's SHA-256", path, st.st_size / 1e9)
    digest = file_sha256(path)
    after = path.stat()
    if settled and (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == \
            (st.st_size, st.st_mtime_ns, st.st_ctime_ns):  # not written to while read
        _DIGESTS[identity] = digest
        if entry is not None:
            try:  # a cache: written whole (renamed into place) or not at all
                entry.parent.mkdir(parents=True, exist_ok=True)
                tmp = entry.with_name(f".{entry.name}.{uuid.uuid4().hex[:8]}")
                tmp.write_text(digest)
                os.replace(tmp, entry)
            except OSError:
                pass
    return digest


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


def is_count(value) -> bool:
    """A whole number >= 0 as JSON holds one (not a bool, a float or a string)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_digest(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def records_problem(recs) -> str | None:
    """Why `recs` (file name -> record, as `records` makes them, read back from a JSON file
    that may have been edited or garbled) is no such map, or None: a plain file name each
    (no folder, so a record cannot point outside its directory), a size and SHA-256 each."""
    if not isinstance(recs, dict):
        return f"its files are recorded as {type(recs).__name__}, a map of file name -> record expected"
    for name, rec in recs.items():
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            return f"it records a file {name!r}, which is no plain file name"
        if not isinstance(rec, dict) or not is_count(rec.get("size")) or not is_digest(rec.get("sha256")) \
                or ("spot" in rec and not is_digest(rec["spot"])):
            return f"its record of {name} is {rec!r}, not a size and SHA-256"
    return None


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
