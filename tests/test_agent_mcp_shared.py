"""Agents sharing one `ToolExecutor`, each with MCP servers in its config, over real servers.

The second agent uses the server the first started (same config), runs beside it, and the
server stops when the last of them closes, in whichever order they close. Each agent offers and
calls only what its own ``[agent.mcp]`` lets it register, the resource tools included.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.errors import ConfigError
from agent_flow.history import ToolResultEntry
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import (
    MCPAgentSettings,
    MCPConnection,
    MCPServerHTTP,
    MCPServers,
    ToolExecutor,
)
from agent_flow.tools.policy import ToolPolicy
from tests.helpers import MCP_SERVERS, stdio_server

CONTEXT = ContextConfig(counter="approx", max_tokens=20_000)
BASIC = stdio_server("basic", "basic_server.py")
NOTES = stdio_server("notes", "resources_server.py")


def echoing(text: str, *, runs: int = 1) -> ScriptedLLM:
    """A model that, in each run, echoes `text` through ``<server>_echo``, then answers."""
    steps: list[object] = []
    for _ in range(runs):
        steps += [reply(tool_calls=[call("basic_echo", text=text)]), f"{text}: done"]
    return ScriptedLLM(steps)  # type: ignore[arg-type]


def agent_on(tools: ToolExecutor, llm: ScriptedLLM, **config: object) -> AgentExecutor:
    settings = AgentConfig.model_validate({"context": CONTEXT, "mcp_servers": (BASIC,), **config})
    return AgentExecutor(llm, config=settings, tools=tools)


def connection(agent: AgentExecutor, server: str = "basic") -> MCPConnection:
    assert agent.mcp.owned is not None
    return agent.mcp.owned.connections[server]


def echoed(agent: AgentExecutor) -> list[str]:
    return [e.content for e in agent.history.entries if isinstance(e, ToolResultEntry)]


@pytest.mark.parametrize("first_to_close", [0, 1])
async def test_agents_sharing_an_executor_share_its_server_and_close_in_either_order(
    first_to_close: int,
) -> None:
    tools = ToolExecutor()
    agents = [agent_on(tools, echoing("one", runs=2)), agent_on(tools, echoing("two", runs=2))]
    # Started together: one server, started once, used by both.
    await asyncio.gather(*(agent.start() for agent in agents))
    started = connection(agents[0])
    assert connection(agents[1]) is started and started.connected

    outcomes = await asyncio.gather(agents[0].run("echo one"), agents[1].run("echo two"))
    assert [o.final_text for o in outcomes] == ["one: done", "two: done"]
    assert [echoed(agent) for agent in agents] == [["one"], ["two"]]

    closing, staying = agents[first_to_close], agents[1 - first_to_close]
    await closing.aclose()
    # The other agent keeps the server and its tools, and runs on.
    assert started.connected and "basic_echo" in tools
    assert not closing.mcp_tools and "basic_echo" in staying.mcp_tools
    again = await staying.run("echo again")
    assert again.final_text.endswith(": done") and len(echoed(staying)) == 2

    await staying.aclose()
    assert not started.connected
    assert not [name for name in tools.names if name.startswith("basic_")]


async def test_a_server_of_the_same_name_configured_differently_is_refused() -> None:
    tools = ToolExecutor()
    first = agent_on(tools, ScriptedLLM([]))
    other = stdio_server("basic", "basic_server.py", timeout=5)
    second = agent_on(tools, ScriptedLLM([]), mcp_servers=(other,))
    async with first:
        with pytest.raises(ConfigError, match=r"MCP server 'basic' already runs for another"):
            await second.start()
        # The refused agent holds nothing: the first one's server and tools are as they were.
        assert connection(first).connected and "basic_echo" in first.mcp_tools
        assert not second.mcp_tools and second.mcp.owned is None
    assert not [name for name in tools.names if name.startswith("basic_")]


async def test_each_agent_offers_and_calls_only_what_its_settings_allow() -> None:
    tools = ToolExecutor()
    quiet_llm = ScriptedLLM(
        [reply(tool_calls=[call("basic_shout", text="hi"), call("basic_echo", text="hi")]), "ok"]
    )
    quiet = agent_on(tools, quiet_llm, mcp={"exclude_components": ["tool:basic/shout"]})
    loud = agent_on(tools, ScriptedLLM([]))
    plain = AgentExecutor(ScriptedLLM([]), config=AgentConfig(context=CONTEXT), tools=tools)
    async with quiet, loud:
        assert "basic_shout" in tools and "basic_shout" in loud.mcp_tools
        offered = {
            "quiet": {t.name for t in quiet.offered_tools()},
            "loud": {t.name for t in loud.offered_tools()},
            "plain": {t.name for t in plain.offered_tools()},
        }
        assert "basic_shout" not in offered["quiet"] and "basic_echo" in offered["quiet"]
        assert {"basic_shout", "basic_echo"} <= offered["loud"]
        # An agent without MCP servers sharing the executor sees none of theirs.
        assert not [name for name in offered["plain"] if name.startswith("basic_")]
        await quiet.run("shout and echo")
        shout, echo = [e for e in quiet.history.entries if isinstance(e, ToolResultEntry)]
        assert shout.is_error and "basic_shout" in shout.content
        assert (echo.is_error, echo.content) == (False, "hi")
        # The first to close takes only what nobody else holds.
        await loud.aclose()
        assert "basic_shout" not in tools and "basic_echo" in tools


async def test_the_resource_tools_read_with_the_calling_agents_own_filter() -> None:
    tools = ToolExecutor()

    def reader(uri: str) -> ScriptedLLM:
        read = call("mcp_read_resource", server="notes", uri=uri)
        return ScriptedLLM([reply(tool_calls=[read]), "read"] * 2)

    hiding = MCPAgentSettings(exclude_components=("resource:notes://config",))
    careful = agent_on(tools, reader("notes://config"), mcp_servers=(NOTES,), mcp=hiding)
    curious = agent_on(tools, reader("notes://config"), mcp_servers=(NOTES,))
    async with careful:
        async with curious:
            await asyncio.gather(careful.run("read"), curious.run("read"))
        # The agent that registered the resource tools first is still open, the other
        # closed: the tools stay, and still answer with the caller's filter.
        await careful.run("read again")
    refused, refused_again = [e for e in careful.history.entries if isinstance(e, ToolResultEntry)]
    (allowed,) = [e for e in curious.history.entries if isinstance(e, ToolResultEntry)]
    assert refused.is_error and "not available to this agent" in refused.content
    assert refused_again.is_error
    assert not allowed.is_error and "eu-west-1" in allowed.content
    assert "mcp_read_resource" not in tools


async def test_agents_given_the_same_started_servers_can_share_an_executor_too() -> None:
    tools = ToolExecutor()
    async with MCPServers([BASIC]) as servers:
        first = AgentExecutor(
            echoing("one"), config=AgentConfig(context=CONTEXT), tools=tools, mcp_servers=servers
        )
        second = AgentExecutor(
            echoing("two"), config=AgentConfig(context=CONTEXT), tools=tools, mcp_servers=servers
        )
        async with first:
            async with second:
                assert first.mcp_tools == second.mcp_tools
            # The second one's leaving takes nothing from the first.
            assert (await first.run("echo")).final_text == "one: done"
        assert "basic_echo" not in tools
        assert servers["basic"].connected  # the application's servers stay up


# -- any order of opening and closing -------------------------------------------------------


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The basic test server over streamable HTTP, for the whole module (started once)."""
    process = subprocess.Popen(
        [sys.executable, str(MCP_SERVERS / "basic_server.py"), "http"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


NAMES = ("a", "b", "c")


@st.composite
def open_close_orders(draw: st.DrawFn) -> list[tuple[str, str]]:
    """Each agent opened once and closed once, later, in any interleaving."""
    order: list[tuple[str, str]] = draw(
        st.permutations([("open", n) for n in NAMES] + [("close", n) for n in NAMES])
    )
    seen: set[str] = set()
    for index, (action, name) in enumerate(order):
        if action == "close" and name not in seen:
            order[index] = ("open", name)  # swap with its open, which comes later
            later = order.index(("open", name), index + 1)
            order[later] = ("close", name)
        seen.add(name)
    return order


@settings(max_examples=15)
@given(order=open_close_orders())
async def test_any_order_of_opening_and_closing_keeps_one_server_while_any_agent_is_open(
    http_url: str, order: list[tuple[str, str]]
) -> None:
    web = MCPServerHTTP(name="basic", url=http_url, policy=ToolPolicy())
    tools = ToolExecutor()
    agents = {
        "a": agent_on(tools, echoing("a", runs=5), mcp_servers=(web,)),
        "b": agent_on(tools, echoing("b", runs=5), mcp_servers=(web,)),
        # Same server, another view of it: never offered shout.
        "c": agent_on(
            tools,
            echoing("c", runs=5),
            mcp_servers=(web,),
            mcp={"exclude_components": ["tool:basic/shout"]},
        ),
    }
    opened: list[str] = []
    connections: list[MCPConnection] = []
    try:
        for action, name in order:
            agent = agents[name]
            if action == "open":
                await agent.start()
                opened.append(name)
            else:
                await agent.aclose()
                opened.remove(name)
            live = {id(connection(agents[n])): connection(agents[n]) for n in opened}
            assert len(live) <= 1  # one server for every open agent
            for started in live.values():
                assert started.connected
                if not connections or connections[-1] is not started:
                    connections.append(started)
            assert all(not c.connected for c in connections if id(c) not in live)
            mcp_names = {n for n in tools.names if n.startswith("basic_")}
            if not opened:
                assert not mcp_names
                continue
            assert mcp_names == {n for a in opened for n in agents[a].mcp_tools}
            assert ("basic_shout" in mcp_names) == bool(set(opened) & {"a", "b"})
            assert all(
                "basic_shout" not in {t.name for t in agents[n].offered_tools()}
                for n in opened
                if n == "c"
            )
            # Every open agent runs at once, each through the one server.
            runs = [agents[n].run(f"echo {n}") for n in opened]
            outcomes = await asyncio.gather(*runs)
            assert [o.final_text for o in outcomes] == [f"{n}: done" for n in opened]
    finally:
        for agent in agents.values():
            with contextlib.suppress(Exception):
                await agent.aclose()
    assert not any(c.connected for c in connections)
