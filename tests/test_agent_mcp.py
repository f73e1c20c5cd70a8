"""An agent starts the MCP servers of its config itself, and stops them, over real stdio."""

from __future__ import annotations

import pytest

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.errors import ConfigError, DuplicateToolError, MCPServerError, UserError
from agent_flow.history import ToolResultEntry
from agent_flow.llm import LLMConfig, OpenAIClient
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import MCPConnection, ToolExecutor, tool
from tests.helpers import stdio_server
from tests.openai_server import OpenAIServer, sse_reply, text_chunks

BASIC = stdio_server("basic", "basic_server.py")
CONTEXT = ContextConfig(counter="approx")


def connections(agent: AgentExecutor) -> list[MCPConnection]:
    assert agent.mcp.owned is not None
    return list(agent.mcp.owned.connections.values())


async def test_entering_an_agent_starts_its_servers_and_leaving_stops_them() -> None:
    llm = ScriptedLLM([reply(tool_calls=[call("basic_echo", text="over stdio")]), "Echoed."])
    config = AgentConfig(context=CONTEXT, mcp_servers=(BASIC,))
    agent = AgentExecutor(llm, config=config)
    assert "basic_echo" not in agent.tools

    async with agent:
        started = connections(agent)
        assert [c.connected for c in started] == [True]
        assert agent.mcp_tools["basic_echo"] == "basic"
        outcome = await agent.run("Echo something")

    assert outcome.final_text == "Echoed."
    assert "basic_echo" in {t.name for t in llm.requests[0].tools}
    (result,) = [e for e in agent.history.entries if isinstance(e, ToolResultEntry)]
    assert (result.is_error, result.content) == (False, "over stdio")
    # Left: the server is stopped and its tools are gone; the agent's own tools stay.
    assert [c.connected for c in started] == [False]
    assert not agent.mcp_tools
    assert not [name for name in agent.tools.names if name.startswith("basic_")]
    assert "task_completion" in agent.tools


async def test_from_config_builds_the_model_and_closes_it_with_the_servers(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_MODEL_KEY", "k")
    openai_server.script(sse_reply(text_chunks("Hello from the server.")))
    model = LLMConfig(model="m", base_url=openai_server.base_url, api_key_env="TEST_MODEL_KEY")
    config = AgentConfig(llm=model, context=CONTEXT, mcp_servers=(BASIC,))

    async with AgentExecutor.from_config(config) as agent:
        assert isinstance(agent.llm, OpenAIClient)
        assert "basic_add" in agent.tools
        outcome = await agent.run("Say hello")
        started = connections(agent)

    assert outcome.final_text == "Hello from the server."
    offered = {t["function"]["name"] for t in openai_server.bodies[0]["tools"]}
    assert {"basic_echo", "basic_add", "task_completion"} <= offered
    assert agent.llm.sdk_client.is_closed()
    assert [c.connected for c in started] == [False]


async def test_a_model_passed_to_from_config_is_the_callers_to_close(
    openai_server: OpenAIServer,
) -> None:
    client = OpenAIClient("m", base_url=openai_server.base_url, api_key="k")
    async with AgentExecutor.from_config(AgentConfig(context=CONTEXT), llm=client) as agent:
        assert agent.llm is client
    assert not client.sdk_client.is_closed()
    await client.aclose()
    with pytest.raises(ConfigError, match="no model is configured"):
        AgentExecutor.from_config(AgentConfig(context=CONTEXT))


async def test_a_server_that_cannot_start_fails_the_entry_and_leaves_nothing_behind(
    openai_server: OpenAIServer,
) -> None:
    model = LLMConfig(model="m", base_url=openai_server.base_url, api_key_env="UNSET_KEY")
    broken = stdio_server("broken", "no_such_server.py", connect_timeout=10)
    config = AgentConfig(llm=model, context=CONTEXT, mcp_servers=(BASIC, broken))
    agent = AgentExecutor.from_config(config)

    with pytest.raises(MCPServerError, match="broken"):
        async with agent:
            pytest.fail("the block must not run")

    assert not [name for name in agent.tools.names if name.startswith(("basic_", "broken_"))]
    assert isinstance(agent.llm, OpenAIClient) and agent.llm.sdk_client.is_closed()


async def test_a_server_tool_whose_name_is_taken_fails_the_entry_and_stops_the_servers() -> None:
    @tool(name="basic_add")
    def taken(a: int) -> int:
        """Already here."""
        return a

    tools = ToolExecutor([taken])
    agent = AgentExecutor(
        ScriptedLLM([]), config=AgentConfig(context=CONTEXT, mcp_servers=(BASIC,)), tools=tools
    )
    with pytest.raises(DuplicateToolError, match="basic_add"):
        await agent.start()
    assert tools.names[0] == "basic_add" and "basic_echo" not in tools
    assert agent.mcp.owned is None
    # A failed start can be retried once the conflict is gone.
    tools.unregister("basic_add")
    await agent.start()
    assert "basic_add" in agent.tools
    await agent.aclose()
    assert "basic_add" not in agent.tools


async def test_an_agent_is_entered_once_and_closed_for_good() -> None:
    agent = AgentExecutor(ScriptedLLM([]), config=AgentConfig(context=CONTEXT))
    async with agent:
        with pytest.raises(UserError, match="already started"):
            await agent.start()
    await agent.aclose()  # a second close does nothing
    with pytest.raises(UserError, match=r"already closed; .* build a new agent"):
        async with agent:
            pass


async def test_an_agent_refuses_to_run_without_its_configured_servers() -> None:
    llm = ScriptedLLM(["never asked"])
    agent = AgentExecutor(llm, config=AgentConfig(mcp_servers=(BASIC,)))

    with pytest.raises(UserError, match=r"MCP servers \(basic\) that are not running"):
        agent.run("Echo something")
    assert llm.requests == []


async def test_a_tool_whose_schema_is_not_a_json_schema_is_left_out_and_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, one such tool of a third-party server raised ToolDefinitionError when the agent
    was entered (a name listed twice, DuplicateToolError): none of the server's tools, and no
    run at all."""
    server = stdio_server("odd", "bad_schema_server.py")
    llm = ScriptedLLM(
        [reply(tool_calls=[call("odd_echo", text="still here")]), "Echoed.", "Again."]
    )
    agent = AgentExecutor(llm, config=AgentConfig(context=CONTEXT, mcp_servers=(server,)))
    async with agent:
        (connection,) = connections(agent)
        assert sorted(connection.refused) == ["broken", "echo"]
        assert "not a valid JSON schema" in connection.refused["broken"]
        assert "listed twice" in connection.refused["echo"]
        assert "odd_echo" in agent.tools and "odd_broken" not in agent.tools
        async with agent.subscribe() as events:
            outcome = await agent.run("Echo something")
            warnings = [e for e in [event async for event in events] if e.kind == "warning_raised"]
        async with agent.subscribe() as events:
            again = await agent.run("Once more")
            later = [e for e in [event async for event in events] if e.kind == "warning_raised"]
        assert later == []  # once per agent, not per run
    assert outcome.final_text == "Echoed." and again.final_text == "Again."
    assert [w.message for w in warnings if w.source == "mcp"] == [
        f"MCP server 'odd': {connection.refused[name]}" for name in ("broken", "echo")
    ]
    assert {t.name for t in llm.requests[0].tools} >= {"odd_echo"}
    assert "odd_broken" not in {t.name for t in llm.requests[0].tools}
    assert any("'broken' is not offered" in r.getMessage() for r in caplog.records)
