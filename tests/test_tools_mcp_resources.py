"""MCP beyond tools on a connection: resources, templates, prompts, subscriptions, list changes.

Against the project's own Python SDK server (tests/mcp_servers/resources_server.py), over
stdio and over streamable HTTP; the npm reference server is in test_tools_mcp_everything.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agent_flow.errors import MCPServerError
from agent_flow.tools import MCPConnection, MCPServerHTTP, RiskLevel, ToolPolicy
from agent_flow.tools.mcp import ListChange
from agent_flow.tools.mcp_resources import prompt_text, resource_record
from tests.helpers import http_mcp_server, stdio_server


@pytest_asyncio.fixture(params=["stdio", "http"])
async def connection(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[MCPConnection]:
    if request.param == "stdio":
        async with MCPConnection(stdio_server("notes", "resources_server.py")) as started:
            yield started
        return
    async with http_mcp_server("resources_server.py", tmp_path / "server.log") as url:
        config = MCPServerHTTP(name="notes", url=url, policy=ToolPolicy())
        async with MCPConnection(config) as started:
            yield started


async def test_resources_templates_and_prompts_are_listed(connection: MCPConnection) -> None:
    assert [str(r.uri) for r in connection.resources] == ["notes://readme", "notes://config"]
    assert [r.mime_type for r in connection.resources] == ["text/markdown", "application/json"]
    assert [t.uri_template for t in connection.resource_templates] == ["notes://by-id/{note_id}"]
    prompts = {p.name: p for p in connection.prompts}
    assert sorted(prompts) == ["greeting", "reviewer"]
    arguments = {a.name: a.required for a in prompts["reviewer"].arguments or []}
    assert arguments == {"language": True, "strictness": False}
    assert connection.subscribable is False  # a Python SDK server serves no resources/subscribe


async def test_a_listed_or_templated_resource_is_read_into_a_record(
    connection: MCPConnection,
) -> None:
    readme = await connection.read_resource("notes://readme")
    record = resource_record("notes", "notes://readme", readme, name="readme")
    assert record["text"] == "# Notes\nThe deploy key lives in vault path ops/deploy."
    assert record["mime_type"] == "text/markdown" and record["truncated"] is False
    filled = await connection.read_resource("notes://by-id/42")
    assert resource_record("notes", "notes://by-id/42", filled)["text"] == (
        "note 42: remember to rotate keys"
    )
    cut = resource_record("notes", "notes://readme", readme, max_chars=7)
    assert cut["text"] == "# Notes" and cut["truncated"] is True


async def test_an_unknown_resource_is_an_error_naming_server_and_uri(
    connection: MCPConnection,
) -> None:
    with pytest.raises(MCPServerError, match=r"'notes' could not read 'notes://nope'"):
        await connection.read_resource("notes://nope")
    # The session is still usable.
    assert (await connection.call_tool("ephemeral", {})).content == "still here"


async def test_a_prompt_is_rendered_with_its_arguments(connection: MCPConnection) -> None:
    rendered = await connection.get_prompt("reviewer", {"language": "Rust", "strictness": "high"})
    assert prompt_text(rendered) == "You review Rust code with high strictness. Cite line numbers."
    default = await connection.get_prompt("reviewer", {"language": "Go"})
    assert "normal strictness" in prompt_text(default)
    with pytest.raises(MCPServerError, match="render its prompt 'reviewer'"):
        await connection.get_prompt("reviewer", {})  # its required argument is missing


async def test_subscribing_where_the_server_does_not_support_it_says_so(
    connection: MCPConnection,
) -> None:
    with pytest.raises(MCPServerError, match="does not support resource subscriptions"):
        await connection.subscribe("notes://readme")


async def test_list_changed_notifications_are_taken_up_by_refresh(
    connection: MCPConnection,
) -> None:
    assert await connection.refresh() == []  # nothing was announced
    await connection.call_tool("add_prompt", {"name": "summarize", "text": "Summarize."})
    await asyncio.wait_for(connection.notices.arrived.wait(), 10)
    assert connection.notices.changed == {"prompts"}
    assert "summarize" not in [p.name for p in connection.prompts]  # not before a refresh
    assert await connection.refresh() == [ListChange("notes", "prompts", ("summarize",), ())]
    assert "summarize" in [p.name for p in connection.prompts]
    assert connection.notices.changed == set()

    await connection.call_tool("add_note", {"name": "todo", "text": "ship it"})
    await connection.call_tool("add_tool", {"name": "fresh"})
    await connection.call_tool("drop_tool", {})
    changes = await connection.refresh()
    assert changes == [
        ListChange("notes", "resources", ("notes://todo",), ()),
        ListChange("notes", "tools", ("fresh",), ("ephemeral",)),
    ]
    names = [tool.name for tool in connection.tools]
    assert "fresh" in names and "ephemeral" not in names
    assert (await connection.call_tool("fresh", {})).content == "fresh"
    read = await connection.read_resource("notes://todo")
    assert resource_record("notes", "notes://todo", read)["text"] == "ship it"


async def test_unannotated_tools_are_destructive_by_the_specs_defaults(tmp_path: Path) -> None:
    async with MCPConnection(stdio_server("notes", "resources_server.py", policy=None)) as c:
        policies = {tool.name: tool.policy for tool in c.tools}
    # No annotations: not read-only, destructive (so it needs approval by default).
    assert policies["drop_tool"] == ToolPolicy(read_only=False, risk=RiskLevel.HIGH)
    # readOnlyHint true: read-only and low risk.
    assert policies["ephemeral"] == ToolPolicy(read_only=True, risk=RiskLevel.LOW)
    # destructiveHint false: neither read-only nor high risk.
    assert policies["add_note"] == ToolPolicy(read_only=False, risk=RiskLevel.LOW)
