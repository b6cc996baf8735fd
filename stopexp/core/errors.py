"""User errors: bad input the user can fix (a config value, a missing or damaged input, an
output directory that cannot be written). Every entry point reports one the same way
(`reported`): `error: <message>` on stderr and exit code 2, no traceback, because the
message already says what is wrong and what to do. STOPEXP_DEBUG=1 (or Hydra's
HYDRA_FULL_ERROR=1) re-raises it with its traceback. Any other exception is a bug and
keeps its traceback.

Imports nothing heavy, so any module can raise these.
"""
from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Iterator

from stopexp.core.commands import make_with

USAGE_EXIT = 2  # as argparse exits on a bad command line; a crash exits 1


class UserError(Exception):
    """Input the user can fix; the message names the key, file or path, the bad value and
    what is allowed or what to do."""


class ConfigError(UserError, ValueError):
    """A config value outside what is allowed; the message names the key."""


class NotFound(UserError, FileNotFoundError):
    """An input the config names (a file, a model, an artifact) is not there; the message
    names it and how to make or point at it."""


class NotMade(NotFound):
    """An artifact that a stage makes is missing: the message names it, where it would be and
    the stage's command, which repeats the command line's `overrides` (set by the stage
    that raises it, or by stopexp.stages.cli for a library call that does not know them)."""

    def __init__(self, what: str, where, stage: str, why: str = "", overrides: list[str] | None = None):
        self.what, self.where, self.stage, self.why, self.overrides = what, where, stage, why, overrides
        super().__init__(what)

    def __str__(self) -> str:
        why = f" ({self.why})" if self.why else ""
        return f"no {self.what} for this config at {self.where}{why}; {make_with(self.stage, self.overrides)}"


class CannotWrite(UserError):
    """An output could not be written for a reason the user can fix (disk full, quota,
    read-only or not permitted). Names the output's final path, never a temporary name;
    what was written before is intact (writes are atomic, stopexp.runtime.artifacts). `setting`,
    when known, is the config key or option that chose the location."""

    # ENOTDIR, EEXIST, ENOENT: a folder on the way is a file, or cannot be made (/proc)
    ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                        errno.ENOTDIR, errno.EEXIST, errno.ENOENT})

    def __init__(self, path, error: OSError, setting: str | None = None):
        super().__init__(path, error)
        self.path, self.error, self.setting = str(path), error, setting

    def __str__(self) -> str:
        where = f"point {self.setting} at" if self.setting else "write to"
        if self.error.errno in (errno.ENOSPC, errno.EDQUOT):
            todo = f"free space on that disk or {where} another one"
        elif self.error.errno in (errno.ENOTDIR, errno.EEXIST, errno.ENOENT):
            todo = f"{where} a directory that can be made there" if self.setting else \
                "choose a path whose folders are folders or can be made"
        else:
            todo = f"make it writable or {where} a directory you can write"
        return (f"cannot write {self.path}: {self.error.strerror or self.error}; {todo}, then "
                "rerun (what was written before is intact)")


@contextlib.contextmanager
def writing(path) -> Iterator[None]:
    """Turn an OS error the user can fix, raised while writing the output `path`, into
    CannotWrite naming `path` (a nested one names the outer, final path)."""
    try:
        yield
    except CannotWrite as e:
        raise CannotWrite(path, e.error) from e.error
    except OSError as e:
        if e.errno not in CannotWrite.ERRNOS:
            raise
        raise CannotWrite(path, e) from e


def debugging() -> bool:
    """STOPEXP_DEBUG=1 or HYDRA_FULL_ERROR=1: user errors keep their traceback."""
    return any(os.environ.get(v, "") not in ("", "0") for v in ("STOPEXP_DEBUG", "HYDRA_FULL_ERROR"))


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """How an entry point ends on a user error: `error: <message>` on stderr, exit code 2
    (the traceback only under `debugging()`). Other exceptions pass unchanged."""
    try:
        yield
    except UserError as e:
        if debugging():
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT) from None


def error_text(e: BaseException, limit: int = 200) -> str:
    """`e` as a user error quotes another library's exception: its class and message on one
    line (pyarrow's and torch's span several), at most `limit` characters of message."""
    return f"{e.__class__.__name__}: {' '.join(str(e).split())[:limit]}"


def fail(key: str, msg: str):
    """Raise ConfigError("<key>: <msg>"): the form of every config check's message."""
    raise ConfigError(f"{key}: {msg}")
