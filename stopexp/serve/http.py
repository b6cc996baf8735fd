"""Serving the app with uvicorn on a socket bound first (so that port 0 gives a free port
known before the first request). SIGTERM and SIGINT drain: no new connection is taken,
every connection accepted before is answered, then `HeldSigterm.serve` returns (the
stage exits 0).

Where uvicorn's own graceful shutdown loses connections, and what this one does instead:
the connections the kernel accepted that uvicorn had not yet taken from the listening
socket's backlog were reset when the socket closed (they are taken and served first), and
a connection whose request had not yet arrived in full was closed at once (it is given
REQUEST_GRACE seconds to send it; those that send nothing are counted). A SIGTERM that
comes before the server runs (the model still loading) is held, not fatal: the server
starts, answers what connected, and stops."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import signal
import socket
import threading
from typing import Callable

import uvicorn

from stopexp.core.errors import ConfigError

log = logging.getLogger(__name__)
REQUEST_GRACE = 2.0  # seconds a connection accepted before the drain has to send its request


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose SIGTERM / SIGINT handler starts its graceful shutdown and,
    unlike uvicorn's own, does not raise the signal again once it is done (which would end
    the process with the signal's status instead of 0); its shutdown answers every
    connection accepted before it (above). `ready()`: called once it serves."""

    def __init__(self, options: uvicorn.Config, ready: Callable | None = None):
        super().__init__(options)
        self.ready, self.unasked, self.adopted = ready, 0, 0

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

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.ready is not None:
            self.ready()

    async def shutdown(self, sockets=None) -> None:
        await self.adopt_backlog(sockets or [])
        for server in self.servers:  # no new connection from here on
            server.close()
        await self.await_requests(REQUEST_GRACE)
        self.unasked = sum(1 for c in self.server_state.connections
                           if getattr(c, "cycle", None) is None and not c.transport.is_closing())
        await super().shutdown(sockets=sockets)

    async def adopt_backlog(self, sockets: list[socket.socket]) -> None:
        """Serve the connections the kernel accepted on `sockets` that are still in their
        backlog (closing a listening socket resets them)."""
        make = functools.partial(self.config.http_protocol_class, config=self.config,
                                 server_state=self.server_state, app_state=self.lifespan.state)
        loop = asyncio.get_running_loop()
        for sock in sockets:
            while True:
                try:
                    conn, _ = sock.accept()
                except (BlockingIOError, InterruptedError, OSError):
                    break
                conn.setblocking(False)
                await loop.connect_accepted_socket(make, conn)
                self.adopted += 1

    async def await_requests(self, grace: float) -> None:
        """Until every open connection has a request under way or answered, or `grace`
        seconds have passed."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        while loop.time() < end and any(getattr(c, "cycle", None) is None and not c.transport.is_closing()
                                        for c in self.server_state.connections):
            await asyncio.sleep(0.01)


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


def server_for(app, ready: Callable | None = None) -> DrainingServer:
    return DrainingServer(uvicorn.Config(app, log_level="warning", access_log=False,
                                         timeout_keep_alive=30, lifespan="off"), ready)


class HeldSigterm:
    """SIGTERM from now on (in the main thread) held for the server that `serve` runs: one
    that comes before it serves makes it drain as soon as it starts."""

    def __init__(self):
        self.server: DrainingServer | None = None
        self.caught = False
        self.old = None

    def __enter__(self) -> "HeldSigterm":
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, self.handle)
        return self

    def handle(self, sig, frame) -> None:
        if self.server is not None:
            self.server.handle_exit(sig, frame)
        self.caught = True

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)

    def serve(self, app, sock: socket.socket, ready: Callable | None = None) -> DrainingServer:
        """Serve `app` on `sock` until SIGTERM / SIGINT (a held one included), then drain
        and return the server (its `adopted` and `unasked` connections)."""
        server = self.server = server_for(app, ready)
        if self.caught:
            server.should_exit = True
        server.run(sockets=[sock])
        return server


@contextlib.contextmanager
def serving_in_thread(app, sock: socket.socket):
    """The app served from a thread while inside (tests, benchmarks); on exit the server
    drains and stops."""
    server = server_for(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join()
