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
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Any

import httpcore2

from agent_flow._utils import readable

__all__ = ["quicken", "sdk_transports"]


def sdk_transports(sdk_client: Any) -> list[Any]:
    """The transports of `sdk_client`'s HTTP client: its own, then those mounted for proxies.

    Entries may be None or of any type (a user's own HTTP client): callers check each.
    """
    http = getattr(sdk_client, "_client", None)
    transports: list[Any] = [getattr(http, "_transport", None)]
    mounts = getattr(http, "_mounts", None)
    if isinstance(mounts, dict):
        transports.extend(mounts.values())
    return transports


def quicken(sdk_client: Any) -> int:
    """Give the pools of `sdk_client` the cheaper idle check; return how many were changed."""
    changed = 0
    for transport in sdk_transports(sdk_client):
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


class _Stream(httpcore2.AsyncNetworkStream):
    """A connection of the SDK's backend, with its socket looked up once.

    Reads, writes and closing are the inner stream's own bound methods (no extra coroutine
    per call); its methods are httpcore2's interface, timeouts in seconds.
    """

    def __init__(self, inner: httpcore2.AsyncNetworkStream) -> None:
        self._inner = inner
        self.read = inner.read  # type: ignore[method-assign]
        self.write = inner.write  # type: ignore[method-assign]
        self.aclose = inner.aclose  # type: ignore[method-assign]
        try:
            sock = inner.get_extra_info("socket")
        except Exception:  # a backend that cannot say: the SDK's own check then answers
            sock = None
        self._socket: socket.socket | None = sock if hasattr(sock, "fileno") else None

    async def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
    ) -> httpcore2.AsyncNetworkStream:
        return _Stream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable" and self._socket is not None:
            return is_readable(self._socket)
        return self._inner.get_extra_info(info)


class _Backend(httpcore2.AsyncNetworkBackend):
    """The SDK's backend, whose connections answer the idle check from a cached socket."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend) -> None:
        self._inner = inner

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
        return _Stream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return _Stream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
