"""The SDK's connection pool split in shards (`agent_flow.llm._pool_shards`).

Real sockets and a real `AsyncOpenAI` over HTTP to the scripted server: every request gets its
answer, the split pool makes no more connections than the single one would, keeps the SDK's
limits in total, one run at a time keeps using one connection, a connection the server closed
while idle is never used again, and pools it cannot split are left as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import SimpleNamespace
from typing import Any

import httpcore2
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from agent_flow.llm import OpenAIClient
from agent_flow.llm._pool_shards import MIN_KEPT_PER_SHARD, SHARDS, ShardedPool, shard
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
        assert pool.limit == single._max_connections  # held across the shards
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
        httpcore2.AsyncConnectionPool(max_keepalive_connections=2 * MIN_KEPT_PER_SHARD - 1),
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


@pytest.mark.parametrize(("connections", "keepalive"), [(32, 20), (1000, 100), (17, 8), (130, 70)])
def test_the_shares_of_the_connections_kept_alive_add_up_to_the_limit(
    connections: int, keepalive: int
) -> None:
    pool = httpcore2.AsyncConnectionPool(
        max_connections=connections, max_keepalive_connections=keepalive
    )
    sdk = _sdk_with(pool)
    assert shard(sdk) == 1
    sharded = _pool(sdk)
    shares = [s._max_keepalive_connections for s in sharded.pools]
    assert len(shares) == min(SHARDS, keepalive // MIN_KEPT_PER_SHARD)
    assert sum(shares) == keepalive and max(shares) - min(shares) <= 1
    assert min(shares) >= MIN_KEPT_PER_SHARD
    assert sharded.limit == connections
    assert all(s._max_connections == connections for s in sharded.pools)


# -- which shard a request goes to -----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 8), st.integers(1, 7)), min_size=2, max_size=8
    ),
    st.integers(0, 100),
)
def test_a_request_goes_to_a_shard_with_a_connection_idle_else_where_most_may_be_kept(
    shards: list[tuple[int, int, int]], requests_before: int
) -> None:
    pools = []
    for held, requests, kept in shards:
        pool = httpcore2.AsyncConnectionPool(max_keepalive_connections=kept)
        pool._connections.extend([object()] * held)  # type: ignore[list-item]
        pool._requests.extend([object()] * requests)  # type: ignore[list-item]
        pools.append(pool)
    sharded = ShardedPool(pools, limit=1000)
    for _ in range(requests_before):  # the shard looked at first turns with each request
        sharded.choose()
    chosen = pools.index(sharded.choose())
    first = requests_before % len(shards)
    in_turn = [(first + offset) % len(shards) for offset in range(len(shards))]
    idle = [index for index in in_turn if shards[index][1] < shards[index][0]]
    if idle:
        assert chosen == idle[0], shards
    else:
        rooms = [kept - held for held, _, kept in shards]
        assert chosen == rooms.index(max(rooms)), shards


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
            pool = _pool(llm.sdk_client)
            room = [s._max_keepalive_connections - len(s._connections) for s in pool.pools]
            assert sum(_held(pool)) == 64
            assert max(room) - min(room) <= 1, room  # spread by each shard's share
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
        assert shard(sdk) == 1 and len(_pool(sdk).pools) == 5
        llm = OpenAIClient("m", sdk_client=sdk)
        answers = await asyncio.gather(*(llm.complete(HELLO) for _ in range(80)))
        assert [a.text for a in answers] == ["hello"] * 80
        assert server.most_open <= 32
        assert sum(_held(_pool(sdk))) <= 20  # idle ones kept: the keep-alive limit in total
        await llm.aclose()
        await sdk.close()


def _sharded_http(connections: int, kept: int, pool_timeout: float) -> httpx2.AsyncClient:
    """An HTTP client with these limits, its pool split."""
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=kept)
    http = httpx2.AsyncClient(limits=limits, timeout=httpx2.Timeout(30.0, pool=pool_timeout))
    assert shard(SimpleNamespace(_client=http)) == 1
    return http


async def test_requests_over_the_limit_wait_in_order_for_a_place_in_any_shard() -> None:
    """32 streams held open fill the limit; 8 more wait, and each gets the place of a closed
    stream whichever shard it was in (none waits behind one shard's own connections)."""
    async with OpenAIServer(handler=lambda request: ANSWER) as server:
        http = _sharded_http(32, 20, pool_timeout=20.0)
        url = f"{server.base_url}/chat/completions"
        async with contextlib.AsyncExitStack() as held:
            streams = [
                await held.enter_async_context(http.stream("POST", url, json={})) for _ in range(32)
            ]
            waiting = [asyncio.create_task(http.post(url, json={})) for _ in range(8)]
            await asyncio.sleep(0.2)
            assert not any(task.done() for task in waiting)
            assert server.connections == 32
            # Eight streams end, in whichever shards they are: the eight waiters take their
            # places and their connections.
            for stream in streams[8:16]:
                await stream.aread()  # read whole: its connection can be used again
                await stream.aclose()
            answers = await asyncio.wait_for(asyncio.gather(*waiting), 10)
            assert [answer.status_code for answer in answers] == [200] * 8
            assert server.connections == 32  # the waiters used the connections freed
        await http.aclose()


async def test_a_request_that_finds_no_place_within_the_pool_timeout_fails_as_a_full_pool() -> None:
    async with OpenAIServer(handler=lambda request: ANSWER) as server:
        http = _sharded_http(16, 8, pool_timeout=0.2)
        url = f"{server.base_url}/chat/completions"
        async with contextlib.AsyncExitStack() as held:
            for _ in range(16):
                await held.enter_async_context(http.stream("POST", url, json={}))
            with pytest.raises(httpx2.PoolTimeout):
                await http.post(url, json={})
        # Its place was not lost: all 16 again, then one more.
        answers = await asyncio.gather(*(http.post(url, json={}) for _ in range(17)))
        assert [answer.status_code for answer in answers] == [200] * 17
        await http.aclose()


class _Instant:
    """A shard that answers at once, its responses open until closed."""

    def __init__(self) -> None:
        self._requests: list[object] = []
        self._connections: list[object] = []
        self._max_keepalive_connections = 1
        self.open = 0

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        self.open += 1
        shard = self

        class Body:
            def __aiter__(self) -> Any:
                return self

            async def __anext__(self) -> bytes:
                raise StopAsyncIteration

            async def aclose(self) -> None:
                shard.open -= 1

        return httpcore2.Response(200, content=Body())


async def test_a_waiter_given_up_as_a_place_comes_free_ends_cancelled_and_the_place_goes_on() -> (
    None
):
    # A waiter's pool timeout is a cancel of its task, as is its caller giving up; the place
    # that came free before it ran again was handed past it, and it must still end cancelled.
    shard_ = _Instant()
    pool = ShardedPool([shard_, shard_], 1)  # type: ignore[list-item]
    request = httpcore2.Request("POST", "http://127.0.0.1:9/")
    first = await pool.handle_async_request(request)
    given_up = asyncio.create_task(pool.handle_async_request(request))
    next_one = asyncio.create_task(pool.handle_async_request(request))
    await asyncio.sleep(0)  # both wait
    given_up.cancel()
    await first.stream.aclose()  # no yield between: the place passes the cancelled waiter
    with pytest.raises(asyncio.CancelledError):
        await given_up
    served = await asyncio.wait_for(next_one, 5)
    await served.stream.aclose()
    assert pool._free == 1 and not pool._waiting


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(st.sampled_from(["request", "close", "cancel", "settle"]), max_size=40),
)
def test_never_more_than_the_limit_open_and_waiters_served_in_order(
    limit: int, steps: list[str]
) -> None:
    async def run() -> None:
        shard_ = _Instant()
        pool = ShardedPool([shard_, shard_], limit)  # type: ignore[list-item]
        request = httpcore2.Request("POST", "http://127.0.0.1:9/")
        started: list[asyncio.Task[httpcore2.Response]] = []
        served: list[int] = []
        closed: set[int] = set()
        for step in steps:
            if step == "request":
                index = len(started)
                task = asyncio.create_task(pool.handle_async_request(request))
                task.add_done_callback(
                    lambda t, i=index: None if t.cancelled() else served.append(i)
                )
                started.append(task)
            elif step == "close":
                for index in served:
                    if index not in closed:
                        closed.add(index)
                        await started[index].result().stream.aclose()  # type: ignore[union-attr]
                        break
            elif step == "cancel":
                for task in started:
                    if not task.done():
                        task.cancel()
                        break
            else:
                # Only here do the tasks run: a close may come between a waiter's cancel (its
                # pool timeout, or its caller giving up) and the waiter running again.
                await asyncio.sleep(0)
            assert shard_.open <= limit
            assert len(served) - len(closed) <= limit
        for task in started:
            task.cancel()
        ended = await asyncio.gather(*started, return_exceptions=True)
        # Each request was served or cancelled: nothing else escapes the pool.
        assert all(isinstance(end, httpcore2.Response | asyncio.CancelledError) for end in ended), (
            ended
        )
        # Served in the order they came, but for those cancelled while waiting.
        assert served == sorted(served)
        for index in served:
            if index not in closed:
                await started[index].result().stream.aclose()  # type: ignore[union-attr]
        assert pool._free == limit and not pool._waiting  # every place given back

    asyncio.run(run())


async def test_a_request_that_fails_gives_its_place_back() -> None:
    http = _sharded_http(16, 8, pool_timeout=0.5)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{unused.getsockname()[1]}/"  # bound, never listening
        for _ in range(20):  # more than the limit: each refused, its place given back
            with pytest.raises(httpx2.ConnectError):
                await http.post(dead, json={})
    assert _pool(SimpleNamespace(_client=http))._free == 16
    await http.aclose()
