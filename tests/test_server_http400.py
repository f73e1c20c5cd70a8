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
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.server import create_app, with_json_400
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


def _protocols() -> list[object]:
    found = []
    for module, name in (
        ("uvicorn.protocols.http.h11_impl", "H11Protocol"),
        ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
        ("uvicorn.protocols.http.zttp_impl", "ZttpProtocol"),
    ):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # not installed here (httptools, zttp)
            continue
    return found


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
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


def _app() -> object:
    config = AgentConfig(context=ContextConfig(counter="approx"))
    return create_app(
        config, store=InMemorySessionStore(), llm_factory=lambda config: ScriptedLLM([])
    )


@pytest.mark.parametrize("protocol", _protocols(), ids=lambda p: getattr(p, "__name__", "?"))
@pytest.mark.parametrize("raw", MALFORMED, ids=["not-http", "header-without-colon", "two-lengths"])
async def test_a_malformed_request_gets_an_error_body_and_the_connection_ends(
    protocol: type[asyncio.Protocol], raw: bytes
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


@pytest.mark.parametrize("protocol", _protocols(), ids=lambda p: getattr(p, "__name__", "?"))
async def test_uvicorn_alone_answers_in_plain_text(protocol: type[asyncio.Protocol]) -> None:
    # What `with_json_400` changes: without it, the same bytes get uvicorn's own text.
    async with serving(_app(), http=protocol) as client:
        status, headers, body = await _exchange(str(client.base_url), MALFORMED[1])
        assert status == 400 and headers["content-type"].startswith("text/plain")
        assert body == b"Invalid HTTP request received."


def test_a_protocol_without_the_hook_is_left_as_it_is() -> None:
    assert with_json_400(asyncio.Protocol) is asyncio.Protocol


async def test_agent_flow_serve_answers_a_malformed_request_with_an_error_body(
    tmp_path: Path,
) -> None:
    async with demo_process(tmp_path, "--no-token") as (client, _):
        status, headers, body = await _exchange(str(client.base_url), MALFORMED[0])
        assert status == 400 and headers["content-type"] == "application/json"
        assert json.loads(body)["code"] == BAD_HTTP_REQUEST
        assert "server" in headers and "date" in headers  # uvicorn's own headers, kept
        assert (await client.get("/endpoints")).status_code == 200
