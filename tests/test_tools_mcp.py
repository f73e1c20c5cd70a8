"""MCP servers as tools, against real servers the tests start (tests/mcp_servers/)."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from agent_flow.messages import ToolCall
from agent_flow.tools import (
    MCP_SERVER_CONFIG_ADAPTER,
    MCPServerHTTP,
    MCPServers,
    MCPServerStdio,
    RiskLevel,
    ToolExecutor,
    ToolHooks,
    ToolPolicy,
)
from tests.helpers import stdio_server
from tests.helpers import tool_call as call

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers() -> AsyncIterator[MCPServers]:
    configs = [
        stdio_server("basic", "basic_server.py"),
        stdio_server("errors", "errors_server.py"),
        stdio_server("content", "content_server.py"),
        stdio_server("paged", "paged_server.py", allow_tools=("tool_*",), deny_tools=("tool_2*",)),
    ]
    async with MCPServers(configs) as started:
        yield started


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def executor(servers: MCPServers) -> ToolExecutor:
    executor = ToolExecutor()
    servers.register(executor)
    return executor


async def test_tools_of_every_server_are_registered_under_their_namespace(
    executor: ToolExecutor,
) -> None:
    names = executor.names
    assert names[:5] == ["basic_echo", "basic_add", "basic_count_to", "basic_header", "basic_shout"]
    assert "errors_rpc_error" in names
    assert "content_picture" in names
    echo = executor.tools["basic_echo"].definition
    assert echo.description == "Return the text unchanged."
    assert echo.parameters["required"] == ["text"]


async def test_every_page_of_tools_is_listed_and_the_allow_and_deny_lists_apply(
    servers: MCPServers, executor: ToolExecutor
) -> None:
    paged = servers["paged"]
    remote = await paged.list_remote_tools()
    assert [t.name for t in remote] == [f"tool_{i:02d}" for i in range(25)]
    offered = [t.name for t in paged.tools]
    assert offered == [f"tool_{i:02d}" for i in range(20)]  # tool_20 .. tool_24 denied
    assert "paged_tool_19" in executor
    assert "paged_tool_24" not in executor
    outcome = await executor.execute_one(call("paged_tool_19", '{"x": 7}'))
    assert outcome.result.content == "tool_19:7"


async def test_calls_return_text_and_structured_content(executor: ToolExecutor) -> None:
    echo, added = await executor.execute(
        [
            call("basic_echo", '{"text": "héllo"}', "1"),
            call("basic_add", '{"numbers": [1, 2, 3]}', "2"),
        ]
    )
    assert echo.result.content == "héllo"
    assert not echo.result.is_error
    assert added.result.data == {"total": 6, "terms": [1, 2, 3]}
    assert '"total": 6' in added.result.content


async def test_arguments_are_validated_against_the_servers_schema_before_the_call(
    executor: ToolExecutor,
) -> None:
    outcome = await executor.execute_one(call("basic_add", '{"numbers": "1,2"}'))
    assert outcome.result.error_kind == "invalid_arguments"
    assert "numbers: '1,2' is not of type 'array'" in outcome.result.content


async def test_progress_notifications_reach_the_hooks(servers: MCPServers) -> None:
    reports: list[tuple[float, float | None, str | None]] = []

    class Hooks(ToolHooks):
        async def progress(
            self, call: ToolCall, progress: float, total: float | None, message: str | None
        ) -> None:
            reports.append((progress, total, message))

    executor = ToolExecutor(hooks=Hooks())
    executor.register(servers["basic"].tools[2], namespace="basic")
    outcome = await executor.execute_one(call("basic_count_to", '{"n": 3}'))
    assert outcome.result.content == "counted to 3"
    assert reports == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]


async def test_an_is_error_result_becomes_an_error_result_with_the_servers_text(
    executor: ToolExecutor,
) -> None:
    reported, raised = await executor.execute(
        [
            call("errors_reported_failure", '{"path": "a.txt"}', "1"),
            call("errors_raises", '{"text": "x"}', "2"),
        ]
    )
    assert reported.result.is_error
    assert reported.result.error_kind == "reported"
    assert reported.result.content == "file a.txt not found"
    assert raised.result.is_error
    assert raised.result.error_kind == "reported"
    assert raised.result.content == "Error executing tool raises"


async def test_a_json_rpc_error_becomes_an_error_result_naming_the_code(
    executor: ToolExecutor,
) -> None:
    outcome = await executor.execute_one(call("errors_rpc_error", '{"text": "x"}'))
    assert outcome.result.error_kind == "mcp_error"
    assert outcome.result.content == (
        "MCP server 'errors' refused the call to 'rpc_error': rejected x (JSON-RPC error -32602)"
    )
    assert outcome.result.data == {
        "code": -32602,
        "message": "rejected x",
        "data": {"field": "text"},
    }


async def test_images_are_described_not_pasted_as_base64(executor: ToolExecutor) -> None:
    outcome = await executor.execute_one(call("content_picture"))
    result = outcome.result
    assert result.content == "[image: image/png, 68 bytes]"
    (attachment,) = result.attachments
    assert (attachment.kind, attachment.mime_type, attachment.size_bytes) == (
        "image",
        "image/png",
        68,
    )
    assert attachment.data is not None
    assert base64.b64decode(attachment.data).startswith(b"\x89PNG")
    assert attachment.data not in result.content


async def test_embedded_resources_and_links_are_described(executor: ToolExecutor) -> None:
    outcome = await executor.execute_one(call("content_documents"))
    assert outcome.result.content.splitlines() == [
        "here are the documents",
        "[resource file:///notes.txt (text/plain)]",
        "remember the milk",
        "[resource file:///data.bin: application/octet-stream, 300 bytes]",
        "[resource link: report https://example.com/report.pdf (application/pdf)]",
    ]
    kinds = [(a.kind, a.uri) for a in outcome.result.attachments]
    assert kinds == [
        ("resource", "file:///data.bin"),
        ("resource_link", "https://example.com/report.pdf"),
    ]


async def test_server_stderr_goes_to_the_log_not_the_terminal(
    executor: ToolExecutor, capfd: pytest.CaptureFixture[str]
) -> None:
    seen = asyncio.Event()
    loop = asyncio.get_running_loop()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "STDERR-MARKER loud" in record.getMessage():
                loop.call_soon_threadsafe(seen.set)

    logger = logging.getLogger("agent_flow.tools.mcp")
    handler = Watch()
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        outcome = await executor.execute_one(call("basic_shout", '{"text": "loud"}'))
        assert outcome.result.content == "LOUD"
        async with asyncio.timeout(5):
            await seen.wait()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    captured = capfd.readouterr()
    assert "STDERR-MARKER" not in captured.err
    assert "STDERR-MARKER" not in captured.out


async def test_mcp_tool_policies_come_from_hints_or_configuration(servers: MCPServers) -> None:
    basic = servers["basic"]
    assert basic.tools[0].policy == ToolPolicy()  # the helper's trusted policy
    echo, add = basic.tools[0].remote, basic.tools[1].remote
    # Without a configured policy, an unannotated tool is destructive, as the spec says.
    assert echo.annotations is None
    hinted = stdio_server("h", "basic_server.py", policy=None)
    assert hinted.policy_for(echo) == ToolPolicy(read_only=False, risk=RiskLevel.HIGH)
    config = stdio_server(
        "x",
        "basic_server.py",
        tool_policies={"echo": ToolPolicy(read_only=True)},
        policy=ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH),
    )
    assert config.policy_for(echo) == ToolPolicy(read_only=True)
    assert config.policy_for(add) == ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH)


async def test_server_configs_load_from_json_by_kind() -> None:
    stdio_config = MCP_SERVER_CONFIG_ADAPTER.validate_json(
        '{"kind": "stdio", "name": "fs", "command": "mcp-fs", "args": ["--root", "."]}'
    )
    http_config = MCP_SERVER_CONFIG_ADAPTER.validate_json(
        '{"kind": "http", "name": "gh", "url": "http://127.0.0.1:9/mcp", "headers": {"A": "b"}}'
    )
    assert stdio_config == MCPServerStdio(name="fs", command="mcp-fs", args=("--root", "."))
    assert http_config == MCPServerHTTP(name="gh", url="http://127.0.0.1:9/mcp", headers={"A": "b"})
    for config in (stdio_config, http_config):
        assert (
            MCP_SERVER_CONFIG_ADAPTER.validate_json(MCP_SERVER_CONFIG_ADAPTER.dump_json(config))
            == config
        )


async def test_allow_and_deny_lists_match_globs_and_deny_wins() -> None:
    config = stdio_server(
        "x", "none.py", allow_tools=("read_*", "list"), deny_tools=("read_secret*",)
    )
    assert [n for n in ("read_file", "read_secrets", "list", "write") if config.allows(n)] == [
        "read_file",
        "list",
    ]


async def test_a_tool_whose_schema_is_not_a_json_schema_is_not_registered_the_rest_are() -> None:
    async with MCPServers([stdio_server("odd", "bad_schema_server.py")]) as started:
        executor = ToolExecutor()
        assert started.register(executor) == ["odd_echo"]
        assert sorted(started.connections["odd"].refused) == ["broken", "echo"]
        (outcome,) = await executor.execute([call("odd_echo", {"text": "hi"})])
        assert outcome.result.content == "hi"


async def test_an_answer_the_sdk_cannot_read_is_named_when_the_call_times_out() -> None:
    """Before, the call said only that the server did not answer: "try a smaller request"."""
    server = stdio_server("raw", "unreadable_server.py", timeout=1.5)
    async with MCPServers([server]) as started:
        executor = ToolExecutor()
        started.register(executor)
        (outcome,) = await executor.execute([call("raw_list_files")])
    assert outcome.result.is_error and outcome.result.error_kind == "mcp_error"
    assert "did not answer the call to 'list_files' within 1.5s" in outcome.result.content
    assert "could not be read (Invalid JSON: lone leading surrogate" in outcome.result.content
