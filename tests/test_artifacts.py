"""Atomic writes (stopexp/runtime/artifacts.py): what a killed writer leaves behind is removed by the
next writer, what a live one is writing is not."""
import os
import socket
import subprocess
import sys

from stopexp.runtime.artifacts import staging_dir, write_json


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_next_write_removes_dead_writers_temporaries_only(tmp_path):
    host, dead = socket.gethostname(), _dead_pid()
    stale_dir = tmp_path / f".shard-00003.tmp~{host}~{dead}~ab12"
    stale_file = tmp_path / f".metrics.json.~{host}~{dead}~cd34.tmp"
    live = tmp_path / f".shard-00004.tmp~{host}~{os.getpid()}~ef56"
    elsewhere = tmp_path / f".shard-00005.tmp~another-host~{dead}~gh78"
    old_copy = tmp_path / ".shard-00006.old-ij90"  # replace_dir's old copy: never swept
    for d in (stale_dir, live, elsewhere, old_copy):
        d.mkdir()
        (d / "data.arrow").write_text("x")
    stale_file.write_text("{")
    made = staging_dir(tmp_path / "shard-00007")
    assert not stale_dir.exists() and not stale_file.exists() and made.exists()
    assert live.exists() and elsewhere.exists() and old_copy.exists()
    again = tmp_path / f".pareto.png.~{host}~{dead}~kl12.tmp"
    again.write_text("half")
    write_json(tmp_path / "metrics.json", {"a": 1})  # an atomic file write sweeps too
    assert not again.exists() and (tmp_path / "metrics.json").read_text() == '{\n  "a": 1\n}'

