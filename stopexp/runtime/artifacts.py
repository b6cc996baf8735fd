"""Artifacts: content hashes of the configs that make them, and writes that never leave a
half-written file behind (write to a temporary name, then rename).

Temporary files and directories come from `tempfile`, which makes them private (0600 /
0700), and some libraries write through private temporaries of their own (safetensors);
each published file and directory, and everything in a published directory, is given the
user's umask, so a shared group can read the outputs like any other file the user writes.
Their names carry the writer's host and process id, so that a writer killed mid-write
(SIGKILL, power loss) leaves nothing behind for long: the next write into the same folder
removes the temporaries of dead writers on its host, and never those of a live one
(concurrent runs share the cache).

Writers of one artifact take turns (`artifact_lock`): the one holding its lock checks what
is there, sets aside what is damaged, computes what is missing and publishes it; the others
wait, then find its result and keep it. A reader needs no lock: what it reads was published
whole by a rename and is never rewritten in place.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock
from omegaconf import DictConfig, OmegaConf

from stopexp.core.errors import writing

log = logging.getLogger(__name__)


def plain(obj: Any) -> Any:
    if isinstance(obj, DictConfig) or OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
    return obj


def config_hash(*parts: Any, length: int = 12) -> str:
    """A stable hash of config sections (dicts, DictConfigs, scalars)."""
    blob = json.dumps([plain(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask: from /proc/self/status on Linux, else by setting it (the only
    portable way to read it) briefly, under a lock, to a stricter value."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def _public_mode(path: Path, is_dir: bool) -> None:
    """Give a tempfile-made file (0600) or directory (0700) the mode a plain `open` or
    `mkdir` would have given it under the user's umask."""
    os.chmod(path, (0o777 if is_dir else 0o666) & ~current_umask())


def _public_modes(root: Path) -> None:
    """`_public_mode` for `root` and everything under it: what a library wrote through
    temporaries of its own is private too (safetensors' `save_file`, hence
    `save_pretrained`, writes 0600). Links are left alone (a chmod follows them)."""
    _public_mode(root, is_dir=True)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            entry = Path(folder, name)
            if not entry.is_symlink():
                _public_mode(entry, is_dir=name in dirs)


def _writer_tag() -> str:
    return f"~{socket.gethostname()}~{os.getpid()}~"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files and directories in `folder` (see `atomic_path`,
    `staging_dir`) whose writer on this host is no longer running; returns them."""
    host, removed = socket.gethostname(), []
    with contextlib.suppress(OSError):
        for entry in Path(folder).iterdir():
            parts = entry.name.split("~")
            temporary = entry.name.endswith(".tmp") or ".tmp~" in entry.name
            if not (entry.name.startswith(".") and temporary) or len(parts) < 4 or parts[-3] != host:
                continue
            if not parts[-2].isdigit() or _alive(int(parts[-2])):
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file name beside `path` to write to; on success it is renamed onto
    `path` (with the user's umask), on error removed. Readers see the old file or the new
    one, never half of one:

        with atomic_path(run_dir / "pareto.png") as tmp:
            fig.savefig(tmp, format="png")
    """
    path = Path(path)
    with writing(path):  # disk full, read-only: one line naming `path` (stopexp.core.errors)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_writer_tag()}", suffix=".tmp")
        os.close(fd)
        try:
            yield Path(tmp)
            _public_mode(Path(tmp), is_dir=False)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file atomically (see `atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write JSON atomically: readers see the old file or the new one, never half of one."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str))


NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})  # flock unsupported there


def lock_file(final: str | os.PathLike) -> Path:
    """The lock file of the artifact at `final`: `.<name>.lock` beside it, outside it."""
    final = Path(final)
    return final.parent / f".{final.name}.lock"


@contextlib.contextmanager
def artifact_lock(final: str | os.PathLike) -> Iterator[None]:
    """Hold the write lock of the artifact at `final` (a file or directory): its writers in
    other threads, processes, or hosts sharing the file system wait until it is released.
    An flock on `lock_file(final)`, which the kernel releases when its holder dies (a killed
    job never leaves it held); the file is never removed, since two writers could then lock
    two files. Reentrant within a thread. Hold it around check, set aside, compute and
    publish, so that a second writer finds the first one's result instead of racing it."""
    final = Path(final)
    lock = FileLock(lock_file(final), is_singleton=True)
    with writing(final):  # a read-only cache names the artifact, not its lock file
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire()
        except OSError as e:
            if e.errno not in NO_LOCKS:
                raise
            log.warning("%s: this file system cannot lock files (%s); writers of this artifact "
                        "do not take turns (each publishes whole, one copy is kept)",
                        final.parent, os.strerror(e.errno))
            lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def publish_dir(tmp_dir: Path, final_dir: Path) -> bool:
    """Move a fully written directory into place. Returns True when this copy was published,
    False when a concurrent writer got there first: its copy is kept and this one dropped
    (both were made from the same config), and the caller reads what is now in place."""
    with writing(final_dir):
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        _public_modes(tmp_dir)
        try:
            os.rename(tmp_dir, final_dir)
        except OSError:
            if not final_dir.exists():
                raise
            shutil.rmtree(tmp_dir, ignore_errors=True)
            return False
        return True


def replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Publish a fully written directory over an existing one (a retrained artifact). The
    old copy is renamed aside, the new one renamed in, then the old one removed: a crash
    never leaves a half-written `final_dir`, nor loses the old copy before the new one is
    complete (between the two renames it is at `.<name>.old-*`; a failed second rename
    puts it back)."""
    if not final_dir.exists():
        publish_dir(tmp_dir, final_dir)
        return
    with writing(final_dir):
        old = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".{final_dir.name}.old-"))
        os.rename(final_dir, old / final_dir.name)
        try:
            publish_dir(tmp_dir, final_dir)
        except BaseException:
            os.rename(old / final_dir.name, final_dir)
            raise
        finally:
            shutil.rmtree(old, ignore_errors=True)


def staging_dir(final_dir: Path) -> Path:
    """A fresh temporary directory beside `final_dir` (same file system, so rename works).
    What is written into it should run under `writing(final_dir)`, so that a full disk
    names the artifact."""
    with writing(final_dir):
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(final_dir.parent)
        return Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".{final_dir.name}.tmp{_writer_tag()}"))
