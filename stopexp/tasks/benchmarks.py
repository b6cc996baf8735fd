"""The benchmarks shipped with the package (stopexp/tasks/data/, whose README.md names each
file's source, commit and license): `task.path` may name one instead of a file or a hub
dataset id, so that `task=gsm8k` or `task=aime25` runs offline on a fresh install.

Each file is JSON Lines with an ``id`` and the fields its conf/task/ config reads: GSM8K
``question`` / ``answer`` (the worked solution ending in ``#### 42``), MATH-500
``problem`` / ``solution`` / ``answer``, the competitions ``problem`` / ``answer``.
"""
from __future__ import annotations

from pathlib import Path

from stopexp.core.names import BENCHMARKS

DATA = Path(__file__).resolve().parent / "data"


def shipped_file(path: str | None) -> Path | None:
    """The shipped JSON Lines file of benchmark `path` (a name in BENCHMARKS), else None."""
    return DATA / f"{path}.jsonl" if path in BENCHMARKS else None
