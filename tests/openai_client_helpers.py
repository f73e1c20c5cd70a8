"""Requests, a client fixture and stream helpers shared by the OpenAIClient tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agent_flow.llm import (
    LLMRequest,
    OpenAIClient,
    StreamEvent,
    TextChunk,
)
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
