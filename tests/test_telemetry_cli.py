"""`agent-flow run --otel` exports the run over OTLP/HTTP, and the terminal shows its cost."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_flow.cli.render import format_cost
from agent_flow.llm.base import Usage
from agent_flow.pricing import price_usage
from agent_flow.sessions import open_store
from tests.openai_server import OpenAIServer, sse_reply, text_chunks, tool_call_chunks
from tests.otlp_receiver import OTLPReceiver

MCP_SERVERS = Path(__file__).parent / "mcp_servers"


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    """A real OTLP/HTTP receiver on 127.0.0.1 decoding what it is sent."""
    with OTLPReceiver() as receiver:
        yield receiver


async def test_run_with_otel_exports_the_genai_span_tree_and_metrics(
    openai_server: OpenAIServer,
    receiver: OTLPReceiver,
    tmp_path: Path,
) -> None:
    openai_server.script(
        sse_reply(tool_call_chunks([("c1", "read_file", '{"path": "notes.txt"}')])),
        sse_reply(tool_call_chunks([("c2", "basic_add", '{"numbers": [2, 3]}')], usage=(500, 20))),
        sse_reply(text_chunks("It says hello.", usage=(1000, 100))),
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_"))},
        "OPENAI_API_KEY": "sk-cli-secret",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "otel-test",
        "AGENT_FLOW_HOME": str(tmp_path / "home"),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_flow.cli",
        "run",
        "what do the notes say?",
        "--model",
        "gpt-4o-mini",
        "--base-url",
        openai_server.base_url,
        "--workspace",
        str(workspace),
        "--db",
        str(tmp_path / "s.db"),
        "--trace",
        "--otel",
        "--yes-all",
        "--mcp",
        f"basic={sys.executable} {MCP_SERVERS / 'basic_server.py'}",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    # The renderer shows each call's cost and the run's beside its tokens. The scripted
    # server names another model in its answers: the price is the requested model's.
    first = price_usage("gpt-4o-mini", Usage(prompt_tokens=20, completion_tokens=9))
    last = price_usage("gpt-4o-mini", Usage(prompt_tokens=1000, completion_tokens=100))
    assert first is not None
    assert last is not None
    shown = out.decode()
    assert f"completion tokens ({format_cost(first)})" in shown
    assert f"completion tokens ({format_cost(last)})" in shown
    paths = {path for path, _ in receiver.raw}
    assert {"/v1/traces", "/v1/metrics"} <= paths
    spans = receiver.spans()
    assert {span.resource["service.name"] for span in spans} == {"otel-test"}
    by_id = {span.span_id: span for span in spans}
    ours = sorted(span.name for span in spans if span.scope == "agent_flow")
    assert ours == ["chat gpt-4o-mini"] * 3 + [
        "execute_tool basic_add",
        "execute_tool read_file",
        "invoke_agent agent",
    ]
    (root,) = [span for span in spans if not span.parent_id]
    assert root.name == "invoke_agent agent"
    # One trace: the MCP SDK's own span of the call is inside the tool's span, not a root.
    assert {span.trace_id for span in spans} == {root.trace_id}
    (mcp_call,) = [span for span in spans if span.scope == "mcp-python-sdk"]
    assert "tools/call" in mcp_call.name
    assert by_id[mcp_call.parent_id].name == "execute_tool basic_add"
    assert all(
        by_id[s.parent_id] is root for s in spans if s.scope == "agent_flow" and s is not root
    )
    # The session the CLI stored is the conversation.
    async with open_store(str(tmp_path / "s.db")) as store:
        (session,) = await store.list()
    for span in spans:
        if span.scope == "agent_flow" and not span.name.startswith("execute_tool"):
            assert span.attributes["gen_ai.conversation.id"] == session.id
    raw = b"".join(body for _, body in receiver.raw)
    assert b"sk-cli-secret" not in raw
    assert b"what do the notes say?" not in raw  # contents stay home unless asked for


def test_costs_are_shown_as_dollars_or_unknown_never_as_zero_for_unknown() -> None:
    assert format_cost(None) == "cost unknown"
    assert format_cost(0.00021) == "$0.00021"
    assert format_cost(1.5) == "$1.50"
    assert format_cost(0.0) == "$0.00"
