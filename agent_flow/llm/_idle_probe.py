"""A cheaper "has the server closed this idle connection?" for the SDK's connection pool.

The OpenAI SDK's transport (httpx2 over httpcore2) asks every idle pooled connection whether
its socket is readable each time a request starts or ends: a readable idle socket is a
connection the server closed. The pool asks through anyio's typed attributes, which rebuild
a table of a dozen lookups (one of them a ``getpeername`` system call) for every question.
With many runs at once that is O(idle connections) per request: measured at 300 runs at
once, a quarter of agent_flow's CPU per turn went to those questions, three quarters of it
anyio's table and a quarter the ``poll`` system call itself.

`quicken(sdk_client)` wraps the network backend of the pools of an `AsyncOpenAI` that
agent_flow built itself: each new connection's socket is looked up once, when it connects,
and the question is one ``poll`` on it, as httpcore2 asks it. Everything else (connecting,
TLS, proxies, reads, writes, timeouts and their errors) is the SDK's own backend, unchanged.
The pools are reached through private attributes of httpx2 and httpcore2: where they are not
what this expects (another version, a user's own HTTP client), nothing is changed and the
SDK's default stands.

The pool asks once per idle connection, twice per request: with a hundred runs at once that
was a hundred ``poll`` calls per pass. A backend's sockets are therefore registered in one
poll object of its own (`_Readable`, from connecting to ``aclose``), and the first question
in a turn of the event loop polls them all at once; the rest of that turn's questions are
answered from that one poll. An answer is at most one turn of the loop old: asyncio itself
learns of a socket's readiness only once per turn, and the pool uses a connection it found
idle only a turn later anyway (its request is sent by its own task).
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from collections.abc import Iterable
from typing import Any

import httpcore2

from agent_flow._utils import readable

__all__ = ["quicken"]


def quicken(sdk_client: Any) -> int:
    """Give the pools of `sdk_client` the cheaper idle check; return how many were changed."""
    http = getattr(sdk_client, "_client", None)
    transports = [getattr(http, "_transport", None)]
    mounts = getattr(http, "_mounts", None)
    if isinstance(mounts, dict):
        transports.extend(mounts.values())
    changed = 0
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if not isinstance(pool, httpcore2.AsyncConnectionPool):
            continue
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, httpcore2.AsyncNetworkBackend) and not isinstance(backend, _Backend):
            pool._network_backend = _Backend(backend)
            changed += 1
    return changed


def is_readable(sock: socket.socket | None) -> bool:
    """Whether a read on `sock` would return at once (data, or the end a closed peer sends).

    A socket that is gone counts as readable: the next read returns the end.
    """
    return readable(-1 if sock is None else sock.fileno())


#: From this many registered sockets on, one poll of them all per turn of the loop is cheaper
#: than a poll of each socket asked (a poll of one is half a microsecond here).
_POLL_ALL_FROM = 4


class _Readable:
    """Which of one backend's sockets are readable: one ``poll`` per turn of the event loop.

    Owner: its `_Backend`. Sockets are registered when their connection is made and dropped
    at its ``aclose``; a socket closed without one stays registered until its number is
    reused (the kernel then reports on the new socket, which registers itself again). A
    socket not registered (no ``select.poll``, a number dropped by a stale ``aclose``), a
    question outside a running asyncio loop, a gone socket, and any socket while fewer than
    `_POLL_ALL_FROM` are registered, are answered on their own.
    """

    def __init__(self) -> None:
        self._poll = select.poll() if hasattr(select, "poll") else None
        self._lock = threading.Lock()  # a poll object is not for two threads at once
        self._registered: set[int] = set()
        #: The registered sockets readable in this turn of the loop; None: not polled yet.
        self._ready: frozenset[int] | None = None

    def watch(self, sock: socket.socket | None) -> None:
        """Register `sock` (a new connection's)."""
        fd = -1 if sock is None else sock.fileno()
        if self._poll is None or fd < 0:
            return
        with self._lock:
            self._poll.register(fd, select.POLLIN)
            self._registered.add(fd)
            self._ready = None  # its number may be a closed socket's, readable in that poll

    def forget(self, sock: socket.socket | None) -> None:
        """Drop `sock` (its connection is closing); a socket closed already is left."""
        fd = -1 if sock is None else sock.fileno()
        if self._poll is None or fd < 0:
            return
        with self._lock:
            if fd in self._registered:
                self._registered.discard(fd)
                self._poll.unregister(fd)

    def readable(self, sock: socket.socket) -> bool:
        """Whether a read on `sock` would return at once (data, or the end)."""
        fd = sock.fileno()
        if fd < 0 or fd not in self._registered or len(self._registered) < _POLL_ALL_FROM:
            return readable(fd)
        ready = self._ready
        if ready is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return readable(fd)
            assert self._poll is not None  # registered: there is a poll object
            with self._lock:
                ready = frozenset([polled for polled, _ in self._poll.poll(0)])
            self._ready = ready
            loop.call_soon(self._expire)
        return fd in ready

    def _expire(self) -> None:
        self._ready = None


class _Stream(httpcore2.AsyncNetworkStream):
    """A connection of the SDK's backend, with its socket looked up once.

    Reads and writes are the inner stream's own bound methods (no extra coroutine per
    call); its methods are httpcore2's interface, timeouts in seconds.
    """

    def __init__(self, inner: httpcore2.AsyncNetworkStream, sockets: _Readable) -> None:
        self._inner = inner
        self._sockets = sockets
        self.read = inner.read  # type: ignore[method-assign]
        self.write = inner.write  # type: ignore[method-assign]
        try:
            sock = inner.get_extra_info("socket")
        except Exception:  # a backend that cannot say: the SDK's own check then answers
            sock = None
        self._socket: socket.socket | None = sock if hasattr(sock, "fileno") else None
        sockets.watch(self._socket)

    async def aclose(self) -> None:
        self._sockets.forget(self._socket)
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
    ) -> httpcore2.AsyncNetworkStream:
        inner = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _Stream(inner, self._sockets)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and self._socket is not None:
            return self._sockets.readable(self._socket)
        return self._inner.get_extra_info(info)


class _Backend(httpcore2.AsyncNetworkBackend):
    """The SDK's backend, whose connections answer the idle check from a cached socket."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend) -> None:
        self._inner = inner
        self._sockets = _Readable()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return _Stream(stream, self._sockets)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return _Stream(stream, self._sockets)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
