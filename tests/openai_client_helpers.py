"""Requests, a client fixture and stream helpers shared by the OpenAIClient tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from httpcore2._utils import is_socket_readable

from agent_flow.llm import (
    LLMRequest,
    OpenAIClient,
    StreamEvent,
    TextChunk,
)
from agent_flow.llm._idle_probe import _Stream
from agent_flow.messages import ChatMessage, ToolDefinition
from tests.openai_server import (
    OpenAIServer,
)

SECRET = "sk-test-0123456789abcdef-SECRET"
READ_FILE = ToolDefinition(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
HELLO = LLMRequest(messages=[ChatMessage(role="user", content="hi")])
WITH_TOOLS = LLMRequest(messages=[ChatMessage(role="user", content="read a.py")], tools=[READ_FILE])


@pytest.fixture
async def client(openai_server: OpenAIServer) -> AsyncIterator[OpenAIClient]:
    llm = OpenAIClient(
        "test-model", base_url=openai_server.base_url, api_key=SECRET, max_retries=2, timeout=5
    )
    yield llm
    await llm.aclose()


async def collect(events: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in events]


def texts(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextChunk))


def pool_streams(llm: OpenAIClient) -> list[Any]:
    """The network streams of the open HTTP/1.1 connections of `llm`'s SDK pool (its shards')."""
    pool = llm.sdk_client._client._transport._pool
    return [c._connection._network_stream for c in pool.connections if c._connection]


async def closed_by_server(server: OpenAIServer, llm: OpenAIClient) -> None:
    """The server closes its idle connections; wait until the client's sockets see the end."""
    streams = pool_streams(llm)
    assert streams and all(isinstance(s, _Stream) for s in streams)
    await server.close_idle()
    for _ in range(400):
        # httpcore2's own check on each socket: the oracle, not the check under test.
        if all(is_socket_readable(s.get_extra_info("socket")) for s in streams):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the client never saw the server close its connections")
