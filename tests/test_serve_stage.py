"""The serve stage's refusals before any compute: each an `error:` line naming the key at
fault (serve.host for an address that is not this machine's, serve.port for a port in use
or reserved), and a missing predictor named with the command that makes it from what the
cache holds (the pipeline, from an empty cache)."""
import errno
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_stage
from stopexp.core.commands import stage_command
from stopexp.core.errors import ConfigError
from stopexp.runtime.overrides import check_overrides
from stopexp.serve.http import bind, bind_error


def refusal(host: str, port: int) -> str:
    with pytest.raises(ConfigError) as e:
        bind(host, port).close()
    return str(e.value)


def test_the_host_is_blamed_for_an_address_and_the_port_for_a_port():
    assert refusal("256.0.0.1", 0).startswith("serve.host: '256.0.0.1' does not resolve (")
    assert refusal("no-such-host.invalid", 8000).startswith("serve.host: 'no-such-host.invalid' does not resolve")
    assert refusal("x..y", 0).startswith("serve.host: 'x..y' does not resolve")
    assert refusal("192.0.2.1", 8000).startswith(  # TEST-NET-1: never this machine's
        "serve.host: cannot listen on 192.0.2.1:8000 (Cannot assign requested address): it is no address "
        "of this machine")
    with bind("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        assert refusal("127.0.0.1", port) == (
            f"serve.port: cannot listen on 127.0.0.1:{port} (Address already in use): the port is in "
            "use; choose another port, or 0 for any free one")
    reserved = OSError(errno.EACCES, "Permission denied")
    assert bind_error("127.0.0.1", 80, reserved).startswith(
        "serve.port: cannot listen on 127.0.0.1:80 (Permission denied): ports below 1024 are reserved to root")
    assert bind_error("127.0.0.1", 8000, reserved).startswith("serve.host, serve.port: ")
    for host in ("127.0.0.1", "localhost", "::1", ""):
        bind(host, 0).close()


def test_the_stage_prints_error_and_blames_the_host(tmp_path):
    done = subprocess.run([sys.executable, "-m", "stopexp.serve", "serve.host=256.0.0.1", "logger=none",
                           f"paths.output_dir={tmp_path}"], cwd=ROOT, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2
    assert done.stderr.startswith(b"error: serve.host: '256.0.0.1' does not resolve (")
    assert done.stderr.count(b"\n") == 1 and b"serve.port" not in done.stderr


def test_a_missing_predictor_on_an_empty_cache_names_the_pipeline(tmp_path, capsys):
    over = ["logger=none", f"paths.output_dir={tmp_path}", "search.n_paths=8"]
    with pytest.raises(SystemExit) as e:
        run_stage("serve", [*over, "serve.port=0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: no trained mlp predictor for this config at ")
    assert err.endswith(f"; nor its features; make them all with: {stage_command('pipeline', over)}\n")
    check_overrides("pipeline", over, validate_run=True)  # the printed command composes and validates
