"""The SDK's connection pool split in shards, so that a request's cost does not grow with the runs.

The OpenAI SDK's transport (httpx2 over httpcore2) keeps one pool of connections per client.
Each time a request starts or ends, the pool walks every connection it holds (is it closed,
expired, idle, available; an idle one's socket polled): with a hundred runs at once sharing
one client, a hundred connections for each request, where the request needs one. Measured at
100 runs at once, that walk was about a fifth of agent_flow's CPU per turn.

`shard(sdk_client)` replaces the pool of an `AsyncOpenAI` that agent_flow built itself with
`ShardedPool`: `SHARDS` pools of the same settings (its TLS context, network backend, socket
options, keep-alive expiry), each limit (connections, idle connections kept alive) split
between them so that the shares add up to the SDK's. Each request goes to one shard, so a
walk covers a sixteenth of the connections: the first with a connection idle (the request
reuses it, as the single pool would have), else the one holding the fewest connections. One
run at a time always uses the first shard and its one connection.

Left as they are: a client whose transport is not what this expects (another version of
httpx2, a user's own HTTP client), a pool through a proxy, HTTP/2 (one connection serves
many requests there), and limits too small to split (under `MIN_PER_SHARD` connections a
shard). The pools are reached through private attributes of httpx2 and httpcore2, as
`agent_flow.llm._idle_probe` reaches them.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

import httpcore2

from agent_flow.llm._idle_probe import sdk_transports

__all__ = ["MIN_PER_SHARD", "SHARDS", "ShardedPool", "shard"]

#: How many pools a client's one pool becomes.
SHARDS = 16

#: The fewest connections a shard may be limited to: below it the pool is not split.
MIN_PER_SHARD = 8


def shard(sdk_client: Any, shards: int = SHARDS) -> int:
    """Split the connection pools of `sdk_client` (see the module); return how many were split."""
    split = 0
    for transport in sdk_transports(sdk_client):
        pool = getattr(transport, "_pool", None)
        if type(pool) is not httpcore2.AsyncConnectionPool:  # a proxy's pool, or already split
            continue
        if pool._http2 or pool._proxy is not None or pool._connections or pool._requests:
            continue
        count = min(shards, pool._max_connections // MIN_PER_SHARD)
        if count < 2:
            continue
        transport._pool = ShardedPool([_like(pool, index, count) for index in range(count)])
        split += 1
    return split


def _like(
    pool: httpcore2.AsyncConnectionPool, index: int, count: int
) -> httpcore2.AsyncConnectionPool:
    """Shard `index` of `count`: `pool`'s settings, and its share of each of its limits.

    The limits are the connections and the idle connections kept alive; the shares of each
    add up to it.
    """
    limit = _share(pool._max_connections, index, count)
    return httpcore2.AsyncConnectionPool(
        ssl_context=pool._ssl_context,
        max_connections=limit,
        max_keepalive_connections=_share(pool._max_keepalive_connections, index, count),
        keepalive_expiry=pool._keepalive_expiry,
        http1=pool._http1,
        http2=pool._http2,
        retries=pool._retries,
        local_address=pool._local_address,
        uds=pool._uds,
        network_backend=pool._network_backend,
        socket_options=pool._socket_options,
    )


def _share(total: int, index: int, count: int) -> int:
    """Part `index` of `total` split in `count` parts as evenly as whole numbers go."""
    share, extra = divmod(total, count)
    return share + (1 if index < extra else 0)


class ShardedPool:
    """Stands in for an httpx2 transport's `httpcore2.AsyncConnectionPool` (see the module).

    The transport calls `handle_async_request`, `aclose` and the context manager methods;
    each response belongs to the shard that answered it, and closing it returns its
    connection there.
    """

    def __init__(self, pools: list[httpcore2.AsyncConnectionPool]) -> None:
        self.pools = pools

    def choose(self) -> httpcore2.AsyncConnectionPool:
        """The shard for the next request.

        The first with a connection idle, else the one holding the fewest connections (so
        that new ones spread over the shards). A shard has a connection idle when it holds
        more connections than requests (in flight or queued).
        """
        fewest = self.pools[0]
        fewest_held = sys.maxsize
        for pool in self.pools:
            held = len(pool._connections)
            if len(pool._requests) < held:
                return pool
            if held < fewest_held:
                fewest, fewest_held = pool, held
        return fewest

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        return await self.choose().handle_async_request(request)

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
