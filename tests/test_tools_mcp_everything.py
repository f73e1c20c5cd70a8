"""Against the MCP reference server ``@modelcontextprotocol/server-everything`` (npm).

What its installed version (tests/mcp_servers/everything/package.json) offers, read from its
``dist`` source: the files of its ``docs`` directory as static resources
(``demo://resource/static/document/<file>``), two URI templates
(``demo://resource/dynamic/{text,blob}/{resourceId}``), four prompts (``simple-prompt``,
``args-prompt`` with ``city`` and optional ``state``, ``completable-prompt``,
``resource-prompt``), resource subscriptions whose ``notifications/resources/updated`` start
with the ``toggle-subscriber-updates`` tool (one at once, then every 5 s), and a
``resources/list_changed`` whenever ``gzip-file-as-resource`` adds a session resource (fed
a ``data:`` URI, it needs no network). It runs under ``node``: ``dist/index.js stdio`` or
``dist/index.js streamableHttp`` (port from ``PORT``, endpoint ``/mcp``).

Installed by ``npm ci`` in tests/mcp_servers/everything (``.ci/run`` does it); without it
these tests skip, except under ``CI=true`` where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig, Skill
from agent_flow.errors import MCPServerError
from agent_flow.events import EnvironmentUpdated, MCPListChanged
from agent_flow.history import ToolResultEntry
from agent_flow.llm.base import LLMRequest
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import (
    MCPAgentSettings,
    MCPConnection,
    MCPPromptRef,
    MCPResourceLoad,
    MCPServerConfig,
    MCPServerHTTP,
    MCPServerStdio,
    RiskLevel,
    ToolPolicy,
)
from agent_flow.tools.mcp import ListChange
from agent_flow.tools.mcp_resources import prompt_text, resource_record
from tests.helpers import MCP_SERVERS

PACKAGE = (
    MCP_SERVERS / "everything" / "node_modules" / "@modelcontextprotocol" / "server-everything"
)
ENTRY = PACKAGE / "dist" / "index.js"
DOCS = sorted(p.name for p in (PACKAGE / "dist" / "docs").glob("*") if p.is_file())
STATIC = "demo://resource/static/document/"
FEATURES = f"{STATIC}features.md"
# A data: URI, so the gzip tool fetches nothing from the network.
HELLO = "data:text/plain;base64,aGVsbG8gd29ybGQ="


def _node() -> str:
    node = shutil.which("node")
    if node is None or not ENTRY.is_file():
        reason = (
            "the MCP reference server is not installed: run `npm ci` in "
            "tests/mcp_servers/everything (needs node)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return node


@contextlib.asynccontextmanager
async def _http_server(node: str, log: Path) -> AsyncIterator[str]:
    with socket.socket() as probe:  # a free port: the server takes it from PORT
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"PATH": os.environ.get("PATH", ""), "PORT": str(port)}
    with log.open("w") as out:
        process = await asyncio.create_subprocess_exec(
            node, str(ENTRY), "streamableHttp", env=env, stdout=out, stderr=asyncio.subprocess.PIPE
        )
        assert process.stderr is not None
        drain: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(30):
                while b"listening on port" not in (line := await process.stderr.readline()):
                    assert line, f"the server exited before listening; its output is in {log}"

            async def drained() -> None:
                assert process.stderr is not None
                while await process.stderr.readline():
                    pass

            drain = asyncio.create_task(drained())
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
            if drain is not None:
                await drain


@pytest_asyncio.fixture(params=["stdio", "streamableHttp"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MCPServerConfig]:
    node = _node()
    if request.param == "stdio":
        yield MCPServerStdio(name="everything", command=node, args=(str(ENTRY), "stdio"))
        return
    async with _http_server(node, tmp_path / "everything.log") as url:
        yield MCPServerHTTP(name="everything", url=url)


async def _wait_for(connection: MCPConnection, done: object) -> None:
    """Wait (on the notification event, no sleeping) until ``done()`` holds."""
    assert callable(done)
    async with asyncio.timeout(15):
        while not done():
            connection.notices.arrived.clear()
            if done():
                return
            await connection.notices.arrived.wait()


async def test_its_documents_templates_and_prompts_are_listed(server: MCPServerConfig) -> None:
    async with MCPConnection(server) as connection:
        assert sorted(str(r.uri) for r in connection.resources) == [STATIC + d for d in DOCS]
        assert [t.uri_template for t in connection.resource_templates] == [
            "demo://resource/dynamic/text/{resourceId}",
            "demo://resource/dynamic/blob/{resourceId}",
        ]
        assert [p.name for p in connection.prompts] == [
            "simple-prompt",
            "args-prompt",
            "completable-prompt",
            "resource-prompt",
        ]
        assert connection.subscribable is True


async def test_documents_and_both_templates_are_read(server: MCPServerConfig) -> None:
    async with MCPConnection(server) as connection:
        features = await connection.read_resource(FEATURES)
        on_disk = (PACKAGE / "dist" / "docs" / "features.md").read_text(encoding="utf-8")
        record = resource_record("everything", FEATURES, features, max_chars=len(on_disk))
        assert record["text"] == on_disk and record["mime_type"] == "text/markdown"
        text = await connection.read_resource("demo://resource/dynamic/text/3")
        text_record = resource_record("everything", "demo://resource/dynamic/text/3", text)
        assert str(text_record["text"]).startswith(
            "Resource 3: This is a plaintext resource created at"
        )
        blob = await connection.read_resource("demo://resource/dynamic/blob/3")
        blob_record = resource_record("everything", "demo://resource/dynamic/blob/3", blob)
        assert blob_record["text"] == ""  # described, never pasted as base64
        (described,) = blob_record["binary"]  # type: ignore[misc]
        assert described == {
            "uri": "demo://resource/dynamic/blob/3",
            "mime_type": "text/plain",
            "size": len(f"Resource 3: This is a base64 blob created at {_time(blob)}"),
        }
        with pytest.raises(MCPServerError, match="Unknown resource"):
            await connection.read_resource("demo://resource/dynamic/text/zero")


def _time(blob: object) -> str:
    import base64

    contents = getattr(blob, "contents")  # noqa: B009 - the SDK's result, read loosely
    decoded = base64.b64decode(contents[0].blob).decode()
    return decoded.rsplit(" created at ", 1)[1]


async def test_prompts_render_with_their_arguments(server: MCPServerConfig) -> None:
    async with MCPConnection(server) as connection:
        args = await connection.get_prompt("args-prompt", {"city": "Paris", "state": "TX"})
        assert prompt_text(args) == "What's weather in Paris, TX?"
        simple = await connection.get_prompt("simple-prompt")
        assert prompt_text(simple) == "This is a simple prompt without arguments."
        embedded = await connection.get_prompt(
            "resource-prompt", {"resourceType": "Text", "resourceId": "2"}
        )
        text = prompt_text(embedded)
        assert text.startswith("This prompt includes the Text resource with id: 2.")
        assert "[resource demo://resource/dynamic/text/2]\nResource 2: This is a plaintext" in text
        with pytest.raises(MCPServerError, match="render its prompt 'args-prompt'"):
            await connection.get_prompt("args-prompt", {})


async def test_a_subscribed_document_reports_its_updates(server: MCPServerConfig) -> None:
    async with MCPConnection(server) as connection:
        await connection.subscribe(FEATURES)
        await connection.call_tool("toggle-subscriber-updates", {})
        await _wait_for(connection, lambda: connection.notices.updates.get(FEATURES, 0) > 0)
        await connection.call_tool("toggle-subscriber-updates", {})  # stop the 5 s updates


async def test_a_new_session_resource_is_announced_and_listed(server: MCPServerConfig) -> None:
    async with MCPConnection(server) as connection:
        await connection.refresh(force=True)  # its tools/list_changed right after initializing
        result = await connection.call_tool(
            "gzip-file-as-resource", {"name": "hello.gz", "data": HELLO}
        )
        assert "demo://resource/session/hello.gz" in result.content
        await _wait_for(connection, lambda: "resources" in connection.notices.changed)
        changes = await connection.refresh()
        assert changes == [
            ListChange("everything", "resources", ("demo://resource/session/hello.gz",), ())
        ]
        read = await connection.read_resource("demo://resource/session/hello.gz")
        assert resource_record("everything", "x", read)["binary"] != []


async def test_tool_policies_follow_its_annotations(server: MCPServerConfig) -> None:
    async with MCPConnection(server) as connection:
        policies = {tool.name: tool.policy for tool in connection.tools}
    assert policies["echo"] == ToolPolicy(read_only=True, risk=RiskLevel.LOW)
    # readOnlyHint false, destructiveHint false: it changes things, not destructively.
    assert policies["gzip-file-as-resource"] == ToolPolicy(read_only=False, risk=RiskLevel.LOW)


async def test_an_agent_uses_its_resources_prompts_and_updates(server: MCPServerConfig) -> None:
    """Filtered components, a resource loaded and reloaded on update, reads, a prompt skill."""
    settings = MCPAgentSettings(
        exclude_components=(
            "tool:get-env",
            "prompt:completable-prompt",
            "resource:demo://resource/dynamic/blob/*",
        ),
        resources=(MCPResourceLoad(server="everything", uri=FEATURES, subscribe=True),),
    )
    skill = Skill(
        name="weather",
        mcp_prompt=MCPPromptRef(
            server="everything", name="args-prompt", arguments={"city": "Oslo"}
        ),
    )
    config = AgentConfig(
        context=ContextConfig(counter="approx", max_tokens=60_000),
        mcp_servers=(server,),
        mcp=settings,
        skills=(skill,),
    )
    agent: AgentExecutor | None = None

    async def model(request: LLMRequest) -> Reply:
        assert agent is not None
        calls = sum(1 for m in request.messages if m.role == "assistant")
        if calls == 0:
            return reply(tool_calls=[call("everything_toggle-subscriber-updates")])
        if calls == 1:
            # The update is taken up before a model call: make sure it has arrived.
            connection = agent.mcp.connections["everything"]
            await _wait_for(connection, lambda: connection.notices.updates.get(FEATURES, 0) > 0)
            return reply(
                tool_calls=[
                    call(
                        "mcp_read_resource",
                        call_id="c2",
                        server="everything",
                        uri=f"{STATIC}startup.md",
                    ),
                    call(
                        "mcp_read_resource",
                        call_id="c3",
                        server="everything",
                        uri="demo://resource/dynamic/blob/1",
                    ),
                ]
            )
        if calls == 2:
            return reply(tool_calls=[call("everything_toggle-subscriber-updates")])
        return "Done."

    llm = FunctionLLM(model)
    agent = AgentExecutor(llm, config=config)
    async with agent:
        offered = {d.name for d in agent.offered_tools()}
        assert {"everything_echo", "mcp_list_resources", "mcp_read_resource"} <= offered
        assert "everything_get-env" not in offered
        loaded = agent.environment.get(f"/knowledge/extra/mcp_resources/{_token(FEATURES)}")
        assert isinstance(loaded, dict) and str(loaded["text"]).startswith("#")
        assert agent.environment.knowledge.sources["everything: features.md"] == FEATURES
        agent.activate_skill("weather")
        assert agent.context.system_prompt_template.startswith("What's weather in Oslo?")
        agent.activate_skill(None)
        subscription = agent.subscribe()
        outcome = await agent.run("Read the startup guide.")
        events = [event async for event in subscription]

    assert outcome.final_text == "Done."
    reloads = [
        e for e in events if isinstance(e, EnvironmentUpdated) and e.source == "mcp:everything"
    ]
    assert reloads and reloads[0].changes[0].pointer.endswith(_token(FEATURES))
    results = {e.call_id: e for e in agent.history.entries if isinstance(e, ToolResultEntry)}
    assert results["c2"].content.startswith(f"[resource everything {STATIC}startup.md]")
    assert results["c3"].is_error and "not available to this agent" in results["c3"].content
    startup = agent.environment.get(
        f"/knowledge/extra/mcp_resources/{_token(STATIC + 'startup.md')}"
    )
    assert isinstance(startup, dict) and startup["server"] == "everything"
    assert not [e for e in events if isinstance(e, MCPListChanged) and e.component == "prompts"]


def _token(uri: str) -> str:
    return uri.replace("~", "~0").replace("/", "~1")
