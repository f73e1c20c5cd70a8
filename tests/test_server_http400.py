"""Bytes that are no HTTP request get the API's JSON error, not uvicorn's plain text.

uvicorn answers what it cannot parse itself, before any app runs. `agent-flow serve` runs its
HTTP protocol through `with_json_400`, so that answer is an `ErrorBody` (400,
``bad_http_request``) like every other refusal. Checked on each of uvicorn's HTTP/1.1
protocols installed here, over a real socket, and on a real ``agent-flow serve`` process.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import pickle
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import _http400, create_app, with_json_400
from agent_flow.server._http400 import BAD_HTTP_REQUEST
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM
from tests.server_harness import serving
from tests.test_cli_serve_demo import demo_process

#: Requests no HTTP/1.1 parser takes: a request line that is no request line, a header line
#: without a colon, and two lengths for one body.
MALFORMED = [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS spoken to plain HTTP\r\n\r\n",
    b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n",
    b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}",
]


def _protocols() -> list[type[asyncio.Protocol]]:
    """uvicorn's HTTP/1.1 protocols installed here (the ones `_http400` knows by name)."""
    found = []
    for name, module in _http400._UVICORN_PROTOCOLS.items():
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # not installed here (httptools, zttp)
            continue
    return found


PROTOCOLS = _protocols()


async def _exchange(base_url: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` on a new connection; the status, headers and body of the answer, read to
    the connection's end (the server closes it)."""
    address = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # to EOF: the server closed it
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


def _app() -> object:
    config = AgentConfig(context=ContextConfig(counter="approx"))
    return create_app(
        config, store=InMemorySessionStore(), llm_factory=lambda config: ScriptedLLM([])
    )


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
@pytest.mark.parametrize("raw", MALFORMED, ids=["not-http", "header-without-colon", "two-lengths"])
async def test_a_malformed_request_gets_an_error_body_and_the_connection_ends(
    protocol: type[asyncio.Protocol], raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(_app(), http=with_json_400(protocol)) as client:
        status, headers, body = await _exchange(str(client.base_url), raw)
        assert status == 400
        assert headers["content-type"] == "application/json"
        assert headers["connection"] == "close"
        assert int(headers["content-length"]) == len(body)
        error = json.loads(body)
        assert error["code"] == BAD_HTTP_REQUEST
        assert "not a well-formed HTTP/1.1 request" in error["message"]
        assert set(error) == {"code", "message", "field", "run_id"}
        # The server goes on answering well-formed requests.
        assert (await client.get("/endpoints")).status_code == 200
    # The protocol's own state (h11's) never saw the answer: nothing complains of it.
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
async def test_uvicorn_alone_answers_in_plain_text(protocol: type[asyncio.Protocol]) -> None:
    # What `with_json_400` changes: without it, the same bytes get uvicorn's own text.
    async with serving(_app(), http=protocol) as client:
        status, headers, _ = await _exchange(str(client.base_url), MALFORMED[1])
        assert status == 400 and headers["content-type"].startswith("text/plain")


async def test_bytes_that_break_inside_a_streamed_answer_close_it_without_a_second_answer() -> None:
    # httptools parses pipelined bytes while an answer is under way (h11 holds them until it
    # ends): a 400 written then would land inside the event stream. The connection ends.
    protocol = next((p for p in PROTOCOLS if p.__name__ == "HttpToolsProtocol"), None)
    if protocol is None:
        pytest.skip("httptools is not installed: only its parser reads ahead of an answer")
    async with serving(_app(), http=with_json_400(protocol)) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        address = urlsplit(str(client.base_url))
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        try:
            host = f"{address.hostname}:{address.port}"
            writer.write(f"GET /sessions/{sid}/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            writer.write(MALFORMED[1])
            await writer.drain()
            rest = await asyncio.wait_for(reader.read(), 10)  # to EOF: the server closed it
        finally:
            writer.close()
            await writer.wait_closed()
        assert b"HTTP/1.1 400" not in rest and BAD_HTTP_REQUEST.encode() not in rest


def test_the_classes_are_named_so_a_config_holding_one_pickles() -> None:
    # uvicorn's workers and reloader start processes from a pickled config.
    for protocol in PROTOCOLS:
        made = with_json_400(protocol)
        assert with_json_400(protocol) is made
        assert made.__name__ == "Json400" + protocol.__name__
        assert getattr(_http400, made.__name__) is made
        assert pickle.loads(pickle.dumps(made)) is made
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    assert _http400.Json400AutoHTTPProtocol is with_json_400(AutoHTTPProtocol)
    with pytest.raises(AttributeError):
        _http400.Json400Nothing  # noqa: B018


def test_a_protocol_without_the_hook_is_left_as_it_is_and_a_name_is_refused() -> None:
    assert with_json_400(asyncio.Protocol) is asyncio.Protocol
    with pytest.raises(TypeError, match="protocol class"):
        with_json_400("h11")  # type: ignore[arg-type]


async def test_agent_flow_serve_answers_a_malformed_request_with_an_error_body(
    tmp_path: Path,
) -> None:
    async with demo_process(tmp_path, "--no-token") as (client, _):
        status, headers, body = await _exchange(str(client.base_url), MALFORMED[0])
        assert status == 400 and headers["content-type"] == "application/json"
        assert json.loads(body)["code"] == BAD_HTTP_REQUEST
        assert "server" in headers and "date" in headers  # uvicorn's own headers, kept
        # A WebSocket upgrade is an HTTP request like any other here: no route, JSON 404.
        upgrade = await client.get(
            "/sessions/x/events",
            headers={
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
        )
        assert upgrade.headers["content-type"] == "application/json", upgrade.text
