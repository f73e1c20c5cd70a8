"""The SDK's connection pool split in shards (`agent_flow.llm._pool_shards`).

Real sockets and a real `AsyncOpenAI` over HTTP to the scripted server: every request gets its
answer, the split pool makes no more connections than the single one would, keeps the SDK's
limits in total, one run at a time keeps using one connection, a connection the server closed
while idle is never used again, and pools it cannot split are left as they are.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpcore2
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from agent_flow.llm import OpenAIClient
from agent_flow.llm._pool_shards import MIN_PER_SHARD, SHARDS, ShardedPool, shard
from tests.openai_client_helpers import HELLO, closed_by_server
from tests.openai_server import OpenAIServer, completion_body, json_reply

ANSWER = json_reply(completion_body("hello"))


def _pool(sdk: Any) -> Any:
    return sdk._client._transport._pool


def _held(pool: ShardedPool) -> list[int]:
    return [len(shard._connections) for shard in pool.pools]


# -- which pools are split, and how ----------------------------------------------------------


async def test_an_openai_client_of_its_own_splits_its_pool_once_keeping_the_sdks_limits() -> None:
    plain = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    single = _pool(plain)
    llm = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    async with llm:
        pool = _pool(llm.sdk_client)
        assert isinstance(pool, ShardedPool) and len(pool.pools) == SHARDS
        assert sum(s._max_connections for s in pool.pools) == single._max_connections
        assert sum(s._max_keepalive_connections for s in pool.pools) == (
            single._max_keepalive_connections
        )
        first = pool.pools[0]
        for each in pool.pools:
            assert each._ssl_context is first._ssl_context  # one TLS context, as before
            assert each._network_backend is first._network_backend  # the idle probe's
            assert each._keepalive_expiry == single._keepalive_expiry
            assert (each._http1, each._http2, each._retries) == (True, False, 0)
        assert shard(llm.sdk_client) == 0  # already split, not split again
    await plain.close()


async def test_an_sdk_client_given_is_used_as_it_is() -> None:
    given_sdk = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    llm = OpenAIClient("m", sdk_client=given_sdk)
    assert type(_pool(llm.sdk_client)) is httpcore2.AsyncConnectionPool
    await llm.aclose()
    await given_sdk.close()


def _sdk_with(pool: object) -> Any:
    return SimpleNamespace(_client=SimpleNamespace(_transport=SimpleNamespace(_pool=pool)))


@pytest.mark.parametrize(
    "pool",
    [
        httpcore2.AsyncConnectionPool(http2=True),  # one connection serves many requests
        httpcore2.AsyncConnectionPool(max_connections=2 * MIN_PER_SHARD - 1),  # too small
        httpcore2.AsyncConnectionPool(max_connections=None, proxy=httpcore2.Proxy("http://p:1")),
        httpcore2.AsyncHTTPProxy(proxy_url="http://127.0.0.1:9"),
        object(),  # not a pool this knows
    ],
    ids=["http2", "small-limit", "proxy-setting", "proxy-pool", "unknown"],
)
def test_pools_it_cannot_split_are_left_alone(pool: object) -> None:
    sdk = _sdk_with(pool)
    assert shard(sdk) == 0
    assert _pool(sdk) is pool


def test_a_pool_already_in_use_is_left_alone() -> None:
    pool = httpcore2.AsyncConnectionPool(max_connections=100)
    pool._connections.append(object())  # type: ignore[arg-type]
    sdk = _sdk_with(pool)
    assert shard(sdk) == 0 and _pool(sdk) is pool


async def test_a_users_own_http_client_and_mock_transport_are_left_alone() -> None:
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, json={}))
    sdk = AsyncOpenAI(
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        http_client=httpx2.AsyncClient(transport=transport),
    )
    assert shard(sdk) == 0 and sdk._client._transport is transport
    await sdk.close()


@pytest.mark.parametrize(("connections", "keepalive"), [(32, 20), (1000, 100), (17, 3), (130, 7)])
def test_the_shares_add_up_to_each_limit(connections: int, keepalive: int) -> None:
    pool = httpcore2.AsyncConnectionPool(
        max_connections=connections, max_keepalive_connections=keepalive
    )
    sdk = _sdk_with(pool)
    assert shard(sdk) == 1
    shards = _pool(sdk).pools
    assert len(shards) == min(SHARDS, connections // MIN_PER_SHARD)
    assert sum(s._max_connections for s in shards) == connections
    assert sum(s._max_keepalive_connections for s in shards) == keepalive
    assert max(s._max_connections for s in shards) - min(s._max_connections for s in shards) <= 1


# -- which shard a request goes to -----------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 8)), min_size=2, max_size=SHARDS))
def test_a_request_goes_to_the_first_shard_with_a_connection_idle_else_the_emptiest(
    shards: list[tuple[int, int]],
) -> None:
    pools = []
    for held, requests in shards:
        pool = httpcore2.AsyncConnectionPool(max_connections=MIN_PER_SHARD)
        pool._connections.extend([object()] * held)  # type: ignore[list-item]
        pool._requests.extend([object()] * requests)  # type: ignore[list-item]
        pools.append(pool)
    chosen = pools.index(ShardedPool(pools).choose())
    idle = [index for index, (held, requests) in enumerate(shards) if requests < held]
    if idle:
        assert chosen == idle[0], shards
    else:
        fewest = min(held for held, _ in shards)
        assert chosen == [held for held, _ in shards].index(fewest), shards


# -- real connections ------------------------------------------------------------------------


async def test_one_run_at_a_time_keeps_using_one_connection() -> None:
    async with OpenAIServer(handler=lambda request: ANSWER) as server:
        llm = OpenAIClient("m", base_url=server.base_url, api_key="k", max_retries=0)
        async with llm:
            for _ in range(20):
                assert (await llm.complete(HELLO)).text == "hello"
            assert server.connections == 1
            assert _held(_pool(llm.sdk_client)) == [1] + [0] * (SHARDS - 1)


async def test_many_at_once_make_no_more_connections_than_one_pool_and_spread_them() -> None:
    async with OpenAIServer(handler=lambda request: ANSWER) as server:
        llm = OpenAIClient("m", base_url=server.base_url, api_key="k", max_retries=0)
        async with llm:
            for _ in range(3):
                answers = await asyncio.gather(*(llm.complete(HELLO) for _ in range(64)))
                assert [a.text for a in answers] == ["hello"] * 64
            assert server.connections == 64  # made once, then reused: as the single pool
            held = _held(_pool(llm.sdk_client))
            assert sum(held) == 64 and max(held) - min(held) <= 1, held
            # The server closes them while idle: none is used again (no retries allowed).
            await closed_by_server(server, llm)
            answers = await asyncio.gather(*(llm.complete(HELLO) for _ in range(64)))
            assert [a.text for a in answers] == ["hello"] * 64
            assert server.connections == 128
        assert _held(_pool(llm.sdk_client)) == [0] * SHARDS  # closed with the client


async def test_the_connection_limit_holds_across_the_shards() -> None:
    limits = httpx2.Limits(max_connections=32, max_keepalive_connections=20)
    async with OpenAIServer(handler=lambda request: ANSWER) as server:
        sdk = AsyncOpenAI(
            base_url=server.base_url,
            api_key="k",
            max_retries=0,
            http_client=httpx2.AsyncClient(limits=limits),
        )
        assert shard(sdk) == 1 and len(_pool(sdk).pools) == 4
        llm = OpenAIClient("m", sdk_client=sdk)
        answers = await asyncio.gather(*(llm.complete(HELLO) for _ in range(80)))
        assert [a.text for a in answers] == ["hello"] * 80
        assert server.connections <= 32
        assert sum(_held(_pool(sdk))) <= 20  # idle ones kept: the keep-alive limit in total
        await llm.aclose()
        await sdk.close()
