"""The SDK's connection pool split in shards, so that a request's cost does not grow with the runs.

The OpenAI SDK's transport (httpx2 over httpcore2) keeps one pool of connections per client.
Each time a request starts or ends, the pool walks every connection it holds (is it closed,
expired, idle, available; an idle one's socket polled): with a hundred runs at once sharing
one client, a hundred connections for each request, where the request needs one. Measured at
100 runs at once, that walk was about a fifth of agent_flow's CPU per turn.

`shard(sdk_client)` replaces the pool of an `AsyncOpenAI` that agent_flow built itself with
`ShardedPool`: `SHARDS` pools of the same settings (its TLS context, network backend, socket
options, keep-alive expiry), each keeping alive its share of the idle connections the SDK
keeps (the shares add up to the SDK's 100). Each request goes to one shard, so a walk covers
a sixteenth of the connections: one holding a connection idle (the request reuses it, as the
single pool would have), else the one with the most room under its share, so that no shard
holds more than it may keep before the whole pool holds more than the SDK keeps (below that,
no connection is closed for want of room and made again). The SDK's limit on connections (1000)
holds across the shards: `ShardedPool` lets that many requests through at once and queues the
rest in the order they came, each up to its pool timeout, as the single pool does. One run at
a time always uses the first shard and its one connection.

What differs from the single pool: a shard's idle connection that turns out expired or closed
is replaced in that shard, where the single pool might have used a live one elsewhere; above
the keep-alive limit (more than 100 requests at once), connections are closed and made again
somewhat more often (each shard keeps its share, 6 or 7); the first shard with a connection
idle is looked for from a shard that turns with each request, so after a burst one
connection per shard may stay warm where the single pool keeps one.

Left as they are: a client whose transport is not what this expects (another version of
httpx2, a user's own HTTP client), a pool through a proxy (one set in the environment
included), HTTP/2 (one connection serves many requests there), and a keep-alive limit too
small to split (under `MIN_KEPT_PER_SHARD` connections a shard). The pools are reached through
private attributes of httpx2 and httpcore2, as `agent_flow.llm._idle_probe` reaches them.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import httpcore2

from agent_flow.llm._idle_probe import sdk_transports

__all__ = ["MIN_KEPT_PER_SHARD", "SHARDS", "ShardedPool", "shard"]

#: How many pools a client's one pool becomes.
SHARDS = 16

#: The fewest idle connections a shard may keep alive: below it the pool is not split.
MIN_KEPT_PER_SHARD = 4


def shard(sdk_client: Any, shards: int = SHARDS) -> int:
    """Split the connection pools of `sdk_client` (see the module); return how many were split."""
    split = 0
    for transport in sdk_transports(sdk_client):
        pool = getattr(transport, "_pool", None)
        if type(pool) is not httpcore2.AsyncConnectionPool:  # a proxy's pool, or already split
            continue
        if pool._http2 or pool._proxy is not None or pool._connections or pool._requests:
            continue
        count = min(shards, pool._max_keepalive_connections // MIN_KEPT_PER_SHARD)
        if count < 2:
            continue
        transport._pool = ShardedPool(
            [_like(pool, index, count) for index in range(count)], pool._max_connections
        )
        split += 1
    return split


def _like(
    pool: httpcore2.AsyncConnectionPool, index: int, count: int
) -> httpcore2.AsyncConnectionPool:
    """Shard `index` of `count`: `pool`'s settings, and its share of the idle connections kept.

    Its connection limit is the whole pool's: `ShardedPool` holds the requests under it.
    """
    share, extra = divmod(pool._max_keepalive_connections, count)
    return httpcore2.AsyncConnectionPool(
        ssl_context=pool._ssl_context,
        max_connections=pool._max_connections,
        max_keepalive_connections=share + (1 if index < extra else 0),
        keepalive_expiry=pool._keepalive_expiry,
        http1=pool._http1,
        http2=pool._http2,
        retries=pool._retries,
        local_address=pool._local_address,
        uds=pool._uds,
        network_backend=pool._network_backend,
        socket_options=pool._socket_options,
    )


class ShardedPool:
    """Stands in for an httpx2 transport's `httpcore2.AsyncConnectionPool` (see the module).

    The transport calls `handle_async_request`, `aclose` and the context manager methods;
    each response belongs to the shard that answered it, and closing it returns its
    connection there and its place under the connection limit here.

    Args:
        pools: The shards.
        limit: The most requests at once (in flight, or answered and not yet closed); more
            wait here in the order they came, each up to its pool timeout (then
            `httpcore2.PoolTimeout`, as a full pool raises).
    """

    def __init__(self, pools: list[httpcore2.AsyncConnectionPool], limit: int) -> None:
        self.pools = pools
        self.limit = limit
        self._free = limit
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._turn = 0

    def choose(self) -> httpcore2.AsyncConnectionPool:
        """The shard for the next request.

        The first holding more connections than requests (one idle, or one it will find
        expired or closed and replace), looking from a shard that turns with each request
        so that every shard's idle connections are looked at (and the expired ones closed)
        as the single pool's are. Else, where a new connection leaves the most room under
        the shard's share of the connections kept alive (the first on ties), so that no
        shard holds more than it may keep before the pool as a whole does.
        """
        pools = self.pools
        count = len(pools)
        turn = self._turn
        self._turn = turn + 1 if turn + 1 < count else 0
        for index in range(turn, turn + count):
            pool = pools[index - count if index >= count else index]
            if len(pool._requests) < len(pool._connections):
                return pool
        roomiest, most_room = pools[0], -sys.maxsize
        for pool in pools:
            room = pool._max_keepalive_connections - len(pool._connections)
            if room > most_room:
                roomiest, most_room = pool, room
        return roomiest

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            await self._wait(request)
        try:
            response = await self.choose().handle_async_request(request)
        except BaseException:
            self._release()
            raise
        response.stream = _Releasing(response.stream, self._release)
        return response

    async def _wait(self, request: httpcore2.Request) -> None:
        """Wait for a place under the limit, handed over by the request that gives it up."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        timeouts = request.extensions.get("timeout") or {}
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await waiter
        except BaseException as err:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed over as the wait ended: give it on
            elif waiter in self._waiting:
                # Not there when a release came between its cancel and now: it passed the
                # cancelled waiter over and gave the place to the next, or back to the pool.
                self._waiting.remove(waiter)
            if isinstance(err, TimeoutError):
                raise httpcore2.PoolTimeout(
                    f"no connection came free within the pool timeout ({self.limit} in use)"
                ) from err
            raise

    def _release(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    @property
    def connections(self) -> list[Any]:
        """Every shard's connections, as `httpcore2.AsyncConnectionPool.connections` lists them."""
        return [connection for pool in self.pools for connection in pool.connections]

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()

    async def __aenter__(self) -> ShardedPool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()


class _Releasing:
    """A response's stream that gives its request's place back once, when it is closed."""

    def __init__(self, stream: Any, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> AsyncIterator[bytes]:
        iterator: AsyncIterator[bytes] = self._stream.__aiter__()
        return iterator

    async def aclose(self) -> None:
        release, self._release = self._release, None
        try:
            if hasattr(self._stream, "aclose"):
                await self._stream.aclose()
        finally:
            if release is not None:
                release()
