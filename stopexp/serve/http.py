"""Serving the app with uvicorn on a socket bound first (so that port 0 gives a free port
known before the first request). SIGTERM and SIGINT drain: no new connection is taken,
every request in flight is answered, then `serve_forever` returns (the stage exits 0)."""
from __future__ import annotations

import contextlib
import signal
import socket
import threading

import uvicorn

from stopexp.core.errors import ConfigError


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose SIGTERM / SIGINT handler starts its graceful shutdown and,
    unlike uvicorn's own, does not raise the signal again once it is done (which would end
    the process with the signal's status instead of 0)."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port); a taken port is serve.port's error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"serve.port: cannot listen on {host}:{port} ({e.strerror or e}); "
                          "choose another port, or 0 for any free one") from None
    sock.listen(2048)
    return sock


def server_for(app, sock: socket.socket) -> DrainingServer:
    return DrainingServer(uvicorn.Config(app, log_level="warning", access_log=False,
                                         timeout_keep_alive=30, lifespan="off"))


def serve_forever(app, sock: socket.socket) -> None:
    """Serve until SIGTERM / SIGINT, then drain and return."""
    server_for(app, sock).run(sockets=[sock])


@contextlib.contextmanager
def serving_in_thread(app, sock: socket.socket):
    """The app served from a thread while inside (tests, benchmarks); on exit the server
    drains and stops."""
    server = server_for(app, sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join()
