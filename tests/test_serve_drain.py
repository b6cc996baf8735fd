"""SIGTERM on a just-started server process: every connection accepted before it is answered
in full (streamed and plain requests alike), whether the signal comes 0.0 to 0.5 s after the
requests or while the model still loads (the connections then wait in the socket's
backlog); the process exits 0 and its log counts the connections it took at the signal."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from test_serve import trained, wait_for  # noqa: F401  (trained: the fixture)

REQUESTS = 6  # half streamed


def request(k: int) -> bytes:
    """Hot sampling, unpruned, 64 paths: the engine thread is busy (and holds the GIL) while
    the connections come in."""
    body = json.dumps({"model": "toy", "prompt": "3+4*7?", "paths": 64, "seed": k, "max_tokens": 200,
                       "temperature": 2.0, "stream": k % 2 == 0, "prune": False}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(120)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("delay", ["loading", 0.0, pytest.param(0.25, marks=pytest.mark.slow), 0.5])
def test_sigterm_answers_every_connection_accepted_before_it(trained, tmp_path, delay):  # noqa: F811
    port, out = free_port(), tmp_path / "stdout"
    with open(out, "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stopexp.serve", *trained, f"serve.port={port}", "serve.max_tokens=200",
             "logger=none",
             f"hydra.run.dir={tmp_path / 'run'}"],
            cwd=ROOT, stdout=stdout, stderr=stderr, env={**os.environ, "OMP_NUM_THREADS": "1"})
    socks = []
    try:
        if delay != "loading":
            wait_for(lambda: "stopexp serve: " in out.read_text() or proc.poll() is not None, timeout=120)
        # the kernel accepts once the port is bound, before the model has loaded
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, timeout=120)
        for k in range(REQUESTS):
            socks.append(socket.create_connection(("127.0.0.1", port)))
            socks[-1].sendall(request(k))
        if delay != "loading":
            time.sleep(delay)
        else:
            assert "stopexp serve: " not in out.read_text()  # the signal comes while it loads
        proc.send_signal(signal.SIGTERM)
        answers = [answer_of(s) for s in socks]
        assert proc.wait(timeout=120) == 0, (tmp_path / "stderr").read_text()
    finally:
        proc.kill()
        for s in socks:
            s.close()
    for k, raw in enumerate(answers):
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK"), (k, raw[:300])
        if k % 2 == 0:
            assert b"data: [DONE]" in body, (k, raw[-300:])
        else:
            assert json.loads(body)["stopexp"]["paths_launched"] == 64
    log = "".join(p.read_text() for p in (tmp_path / "run").glob("*.log"))
    assert "drained: every request received was answered" in log, log
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())["serve"]
    assert metrics["answered"] == REQUESTS and metrics["closed_unasked"] == 0
