"""Serving the app with uvicorn on a socket bound first (so that port 0 gives a free port
known before the first request). SIGTERM and SIGINT drain: no new connection is taken,
every request in flight is answered, then `serve_forever` returns (the stage exits 0)."""
from __future__ import annotations

import contextlib
import errno
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
    """A listening socket on host:port (0: a free port). What cannot be bound is the error
    of the key at fault: serve.host for a name that does not resolve or an address that is
    not this machine's, serve.port for a port in use or one reserved to root."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(  # "": every interface, as bind's
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or e  # an IDNA error for a malformed name has none
        raise ConfigError(f"serve.host: {host!r} does not resolve ({reason}); give an address of this "
                          "machine (127.0.0.1, 0.0.0.0 for every interface, ::1) or a name that "
                          "resolves to one") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ConfigError(bind_error(host, port, e)) from None
    sock.listen(2048)
    return sock


def bind_error(host: str, port: int, e: OSError) -> str:
    """The message of a failed bind, naming the key at fault."""
    where = f"cannot listen on {host}:{port} ({e.strerror or e})"
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"serve.host: {where}: it is no address of this machine; give one of its "
                "addresses (127.0.0.1, or 0.0.0.0 for every interface)")
    if e.errno in (errno.EACCES, errno.EPERM) and 0 < port < 1024:
        return f"serve.port: {where}: ports below 1024 are reserved to root; choose 1024..65535, or 0 for any free one"
    if e.errno == errno.EADDRINUSE:
        return f"serve.port: {where}: the port is in use; choose another port, or 0 for any free one"
    return f"serve.host, serve.port: {where}; choose another address or port"


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
