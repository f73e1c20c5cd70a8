"""The SDK pool's idle-connection check, answered from a socket looked up once per connection.

Real sockets, a real `AsyncOpenAI` over HTTP and HTTPS to the scripted server: the check must
say what httpcore2's own says, a connection the server closed while idle must never be used
for the next request, and TLS, proxies and a user's own HTTP client must be left working.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpcore2
import httpx2
import pytest
from httpcore2._utils import is_socket_readable
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from agent_flow.llm import OpenAIClient
from agent_flow.llm._idle_probe import _Backend, is_readable, quicken
from tests.openai_client_helpers import HELLO, closed_by_server, pool_streams
from tests.openai_server import OpenAIServer, completion_body, json_reply

ANSWER = json_reply(completion_body("hello"))


def _backends(sdk: AsyncOpenAI) -> list[Any]:
    """The network backend of each pool of `sdk`'s transport (one per shard)."""
    pool = sdk._client._transport._pool
    return [shard._network_backend for shard in getattr(pool, "pools", [pool])]


# -- the check itself ----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["send", "read", "close_peer", "close_own"]), max_size=8))
def test_the_check_answers_what_httpcore2s_own_answers(steps: list[str]) -> None:
    ours, peer = socket.socketpair()
    try:
        for step in steps:
            if step == "send" and peer.fileno() >= 0 and ours.fileno() >= 0:
                peer.send(b"x")
            elif step == "read" and ours.fileno() >= 0:
                ours.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    ours.recv(64)
            elif step == "close_peer":
                peer.close()
            elif step == "close_own":
                ours.close()
            assert is_readable(ours) == is_socket_readable(ours), steps
    finally:
        ours.close()
        peer.close()


def test_the_check_says_readable_for_data_the_end_and_a_gone_socket() -> None:
    ours, peer = socket.socketpair()
    with ours, peer:
        assert not is_readable(ours)
        peer.send(b"unasked")
        assert is_readable(ours)
        ours.recv(64)
        assert not is_readable(ours)
        peer.close()
        assert is_readable(ours)  # the end a closed peer sends
    assert is_readable(ours)  # closed: the next read would fail, as at the end
    assert is_readable(None)


# -- which pools get it --------------------------------------------------------------------


async def test_an_openai_client_of_its_own_gets_the_check_once() -> None:
    llm = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    async with llm:
        assert all(isinstance(backend, _Backend) for backend in _backends(llm.sdk_client))
        assert len(_backends(llm.sdk_client)) > 1  # and the pool split (its own test file)
        assert quicken(llm.sdk_client) == 0  # already done, not wrapped twice
    async with AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k") as sdk:
        assert not isinstance(sdk._client._transport._pool._network_backend, _Backend)
        assert quicken(sdk) == 1


async def test_proxy_pools_from_the_environment_get_it_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("NO_PROXY", "ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    sdk = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    pools = [t._pool for t in sdk._client._mounts.values() if t is not None]
    assert pools and all(isinstance(p, httpcore2.AsyncHTTPProxy) for p in pools)
    assert quicken(sdk) == 1 + len(pools)
    await sdk.close()


async def test_a_users_own_http_client_is_left_alone() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json={})

    transport = httpx2.MockTransport(answer)
    sdk = AsyncOpenAI(
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        http_client=httpx2.AsyncClient(transport=transport),
    )
    assert quicken(sdk) == 0
    assert sdk._client._transport is transport
    await sdk.close()


# -- real connections ----------------------------------------------------------------------


async def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    async with OpenAIServer(handler=lambda request: ANSWER) as server:
        llm = OpenAIClient("m", base_url=server.base_url, api_key="k", max_retries=0)
        async with llm:
            assert (await llm.complete(HELLO)).text == "hello"
            assert (await llm.complete(HELLO)).text == "hello"
            assert server.connections == 1  # kept alive and reused
            await closed_by_server(server, llm)
            # No retries allowed: a request sent on the dead connection would fail.
            assert (await llm.complete(HELLO)).text == "hello"
            assert server.connections == 2


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made with the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed: no certificate for the TLS server")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
async def tls_server(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[OpenAIServer]:
    """The scripted server over HTTPS, its self-signed certificate trusted by the client."""
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read when the client is made
    async with OpenAIServer(handler=lambda request: ANSWER, ssl=context) as server:
        yield server


async def test_tls_connections_are_checked_on_their_own_socket(tls_server: OpenAIServer) -> None:
    assert tls_server.base_url.startswith("https://")
    llm = OpenAIClient("m", base_url=tls_server.base_url, api_key="k", max_retries=0)
    async with llm:
        assert (await llm.complete(HELLO)).text == "hello"
        assert (await llm.complete(HELLO)).text == "hello"
        assert tls_server.connections == 1
        (stream,) = pool_streams(llm)
        assert stream.get_extra_info("ssl_object") is not None  # TLS, through the wrapper
        assert stream.get_extra_info("is_readable") is False
        await closed_by_server(tls_server, llm)
        assert (await llm.complete(HELLO)).text == "hello"
        assert tls_server.connections == 2


async def test_a_servers_shared_clients_get_the_check() -> None:
    from agent_flow.llm.config import LLMConfig
    from agent_flow.server._clients import ModelClients

    clients = ModelClients()
    config = LLMConfig(model="m", base_url="http://127.0.0.1:9/v1")  # a local server: no key
    session = clients.client(config)
    assert quicken(session.sdk_client) == 0  # the shared SDK client already has it
    assert all(isinstance(backend, _Backend) for backend in _backends(session.sdk_client))
    await session.aclose()
    await clients.aclose()


def test_the_check_works_where_there_is_no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows and eventlet have no ``select.poll``: the check falls back to ``select``."""
    import select

    monkeypatch.delattr(select, "poll")
    ours, peer = socket.socketpair()
    with ours, peer:
        assert not is_readable(ours)
        peer.send(b"x")
        assert is_readable(ours)
