"""MCP servers that crash, hang, freeze or never start: failures become results, not crashes."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from pathlib import Path

import pytest

from agent_flow.errors import MCPServerError, MCPServerTimeoutError, ToolDefinitionError
from agent_flow.messages import ToolCall
from agent_flow.tools import (
    MCPConnection,
    MCPServers,
    MCPServerStdio,
    ToolExecutor,
    ToolHooks,
    _mcp_connection,
)
from agent_flow.tools._mcp_restarts import RestartBudget
from tests.helpers import MCP_SERVERS, FakeClock, stdio_server
from tests.helpers import tool_call as call
from tests.server_harness import marked


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The restart budgets of the connections made in the test read this clock."""
    made = FakeClock()
    monkeypatch.setattr(
        _mcp_connection, "RestartBudget", functools.partial(RestartBudget, clock=made)
    )
    return made


async def test_a_crashed_server_fails_the_call_in_flight_and_restarts_on_next_use(
    clock: FakeClock,
) -> None:
    executor = ToolExecutor()
    async with MCPServers([stdio_server("crashy", "crash_server.py", max_restarts=1)]) as servers:
        servers.register(executor)
        connection = servers["crashy"]
        assert (
            await executor.execute_one(call("crashy_echo", '{"text": "one"}'))
        ).result.content == ("one")

        crashed = await executor.execute_one(call("crashy_crash"))
        assert crashed.result.error_kind == "server_unavailable"
        assert crashed.result.content.startswith(
            "MCP server 'crashy' closed the connection during the call to 'crash'"
        )
        assert crashed.result.content.endswith("it will be restarted on the next call")
        assert not connection.connected

        restarted = await executor.execute_one(call("crashy_echo", '{"text": "two"}'))
        assert restarted.result.content == "two"
        assert connection.restarts == 1
        assert connection.connected

        # The restart budget (1) is spent: the next crash is final, and says so at once.
        await executor.execute_one(call("crashy_crash"))
        final = await executor.execute_one(call("crashy_echo", '{"text": "three"}'))
        assert final.result.error_kind == "server_unavailable"
        assert final.result.content.startswith("MCP server 'crashy' stopped (")
        assert final.result.content.endswith(
            "and was restarted 1 time in the last 600s, the limit (max_restarts); "
            "it is tried again in 600s"
        )
        assert connection.restarts == 1


async def test_a_restart_counts_against_the_limit_only_within_the_restart_window(
    clock: FakeClock,
) -> None:
    executor = ToolExecutor()
    config = stdio_server("crashy", "crash_server.py", max_restarts=1, restart_window=1.5)
    async with MCPServers([config]) as servers:
        servers.register(executor)
        connection = servers["crashy"]
        await executor.execute_one(call("crashy_crash"))
        assert (
            await executor.execute_one(call("crashy_echo", '{"text": "a"}'))
        ).result.content == "a"
        await executor.execute_one(call("crashy_crash"))
        refused = await executor.execute_one(call("crashy_echo", '{"text": "b"}'))
        assert refused.result.error_kind == "server_unavailable"
        assert "in the last 1.5s, the limit (max_restarts)" in refused.result.content
        clock.now += 1.6  # the first restart leaves the window: one more may be made
        again = await executor.execute_one(call("crashy_echo", '{"text": "c"}'))
        assert again.result.content == "c"
        assert connection.restarts == 2


async def test_a_hanging_call_times_out_and_a_frozen_server_is_restarted(tmp_path: Path) -> None:
    log = tmp_path / "hang.log"
    config = stdio_server(
        "hang", "hang_server.py", timeout=0.5, ping_timeout=0.5, max_restarts=2, stderr_log=str(log)
    )
    in_flight = asyncio.Event()

    class Hooks(ToolHooks):
        async def progress(
            self, call: ToolCall, progress: float, total: float | None, message: str | None
        ) -> None:
            in_flight.set()  # the server received the call

    executor = ToolExecutor(hooks=Hooks())
    async with MCPConnection(config) as connection:
        for tool in connection.tools:
            executor.register(tool, namespace="hang")

        # A tool that never answers: a timeout error, and the session stays usable.
        hung = await executor.execute_one(call("hang_hang"))
        assert hung.result.error_kind == "timeout"
        assert hung.result.content == (
            "MCP server 'hang' did not answer the call to 'hang' within 0.5s; try a smaller request"
        )
        after = await executor.execute_one(call("hang_echo", '{"text": "still here"}'))
        assert after.result.content == "still here"
        assert connection.restarts == 0

        # A server that stops answering anything: the next call finds out and restarts it.
        frozen = await executor.execute_one(call("hang_freeze"))
        assert frozen.result.error_kind == "timeout"
        revived = await executor.execute_one(call("hang_echo", '{"text": "back"}'))
        assert revived.result.content == "back"
        assert connection.restarts == 1
        assert connection.last_error == "no answer to a ping within 0.5s"

        # Cancelling a call in flight leaves the session usable too.
        in_flight.clear()
        task = asyncio.create_task(executor.execute([call("hang_hang")]))
        await in_flight.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        again = await executor.execute_one(call("hang_echo", '{"text": "again"}'))
        assert again.result.content == "again"
        assert connection.restarts == 1
    # Its stderr went to the configured file: both starts wrote their banner there.
    assert log.read_text().count("hang server starting") == 2
    after_close = await connection.call_tool("echo", {"text": "closed"})
    assert after_close.error_kind == "server_unavailable"
    assert after_close.content == "MCP connection 'hang' is closed"


FAILING = (sys.executable, "-c", "import sys; sys.exit(1)")


async def test_a_server_that_cannot_start_raises_a_clear_error() -> None:
    missing = MCPServerStdio(name="missing", command="/nonexistent/mcp-server")
    with pytest.raises(MCPServerError, match="MCP server 'missing' could not be started"):
        async with MCPConnection(missing):
            pass
    dies = MCPServerStdio(name="dies", command=FAILING[0], args=FAILING[1:])
    with pytest.raises(MCPServerError, match="MCP server 'dies' could not be started"):
        async with MCPServers([dies]):
            pass


async def test_an_optional_server_that_cannot_start_is_skipped() -> None:
    optional = MCPServerStdio(name="extra", command=FAILING[0], args=FAILING[1:], required=False)
    async with MCPServers([optional]) as servers:
        assert servers.connections == {}
        assert "could not be started" in servers.failed["extra"]
        assert servers.tools() == []


async def test_two_servers_with_one_name_are_rejected() -> None:
    config = MCPServerStdio(name="same", command="x")
    with pytest.raises(ToolDefinitionError, match="two MCP servers are named 'same'"):
        MCPServers([config, config])


async def test_a_server_that_died_while_idle_is_restarted_before_the_next_call() -> None:
    async with MCPConnection(
        stdio_server("crashy", "crash_server.py", max_restarts=1)
    ) as connection:
        session = connection._session
        assert session is not None
        exited = asyncio.Event()
        session.output.on_closed = exited.set  # told when the server's stream ends
        pid = int((await connection.call_tool("pid", {})).content)
        os.kill(pid, signal.SIGKILL)
        await exited.wait()
        assert not connection.connected
        # Not "closed the connection during the call": noticed and restarted first.
        result = await connection.call_tool("echo", {"text": "back"})
        assert not result.is_error, result.content
        assert result.content == "back"
        assert connection.restarts == 1
        assert connection.last_error == "the server exited while idle"


def failing_server(*lines: str) -> MCPServerStdio:
    script = "import sys\n" + "".join(f"print({line!r}, file=sys.stderr)\n" for line in lines)
    return MCPServerStdio(
        name="broken", command=sys.executable, args=("-c", script + "sys.exit(2)")
    )


async def test_a_server_that_fails_to_start_shows_its_last_stderr_lines(tmp_path: Path) -> None:
    lines = [f"starting step {i}" for i in range(8)] + ["error: config file /etc/x.toml missing"]
    with pytest.raises(MCPServerError) as caught:
        async with MCPConnection(failing_server(*lines)):
            pass
    message = str(caught.value)
    assert message.startswith("MCP server 'broken' could not be started: ")
    assert message.endswith(
        "; its stderr ended with: starting step 4 | starting step 5 | starting step 6 | "
        "starting step 7 | error: config file /etc/x.toml missing"
    )
    # Also when the lines go to a log file.
    log = tmp_path / "broken.log"
    logged = failing_server("error: no token").model_copy(update={"stderr_log": str(log)})
    with pytest.raises(MCPServerError, match=r"its stderr ended with: error: no token$"):
        async with MCPConnection(logged):
            pass
    assert log.read_text() == "error: no token\n"


async def test_a_server_that_never_answers_says_what_timed_out_after_how_long() -> None:
    silent = MCPServerStdio(
        name="silent",
        command=sys.executable,
        args=("-c", "import sys; print('waiting', file=sys.stderr, flush=True); sys.stdin.read()"),
        connect_timeout=0.5,
    )
    with pytest.raises(MCPServerTimeoutError) as caught:
        async with MCPConnection(silent):
            pass
    assert str(caught.value) == (
        "MCP server 'silent' did not answer its initialization and listing within 0.5s "
        "(its connect_timeout); a server that is slow to start needs a longer connect_timeout; "
        "its stderr ended with: waiting"
    )


async def test_tools_whose_names_differ_only_in_dots_are_both_offered() -> None:
    executor = ToolExecutor()
    async with MCPServers([stdio_server("env", "env_server.py")]) as servers:
        names = servers.register(executor)
        assert "env_get_sum" in names
        (dotted,) = [n for n in names if n.startswith("env_get_sum_")]
        plain = await executor.execute_one(call("env_get_sum", '{"a": 1, "b": 2}'))
        other = await executor.execute_one(call(dotted, '{"a": 1, "b": 2}'))
    assert plain.result.content == "plain 3"
    assert other.result.content == "dotted 3"


async def test_a_start_cancelled_midway_stops_the_servers_that_had_started() -> None:
    """One server up, another still starting, the start cancelled: no process is left."""
    marker = f"cancelled-start-{os.getpid()}"
    quick = stdio_server("quick", "basic_server.py", env={"AF_TEST_MCP": marker})
    slow = MCPServerStdio(
        name="slow",
        command="/bin/sh",
        args=("-c", f"sleep 30; exec {sys.executable} {MCP_SERVERS / 'basic_server.py'}"),
        env={"AF_TEST_MCP": marker},
        connect_timeout=60,
    )
    servers = MCPServers([quick, slow])
    starting = asyncio.create_task(servers.start())
    async with asyncio.timeout(30):
        while not servers["quick"].connected:  # noqa: ASYNC110 (a connection's state, no event)
            await asyncio.sleep(0.02)
    assert len(marked("AF_TEST_MCP", marker)) >= 2  # the quick server, the slow one's shell
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert not servers["quick"].connected
    async with asyncio.timeout(10):
        while left := marked("AF_TEST_MCP", marker):  # noqa: ASYNC110 (processes, no event)
            await asyncio.sleep(0.05)
    assert left == []


@pytest.mark.parametrize("closing", ["agent", "servers"])
async def test_a_close_cancelled_as_it_begins_still_stops_every_server(closing: str) -> None:
    """Out of the pool (or of the agent) first, a server a cancel kept from closing would run
    on with nobody left to stop it: the stop goes on, the caller gets its cancel."""
    from agent_flow.agent import AgentExecutor
    from agent_flow.config import AgentConfig
    from agent_flow.testing import ScriptedLLM

    marker = f"cancelled-close-{closing}-{os.getpid()}"
    configs = [
        stdio_server(name, script, env={"AF_TEST_MCP": marker})
        for name, script in (("basic", "basic_server.py"), ("hangs", "hang_server.py"))
    ]
    if closing == "agent":
        agent = AgentExecutor(ScriptedLLM([]), config=AgentConfig(mcp_servers=configs))
        await agent.start()
        close = agent.aclose
    else:
        servers = MCPServers(configs)
        await servers.start()
        close = servers.aclose
    assert len(marked("AF_TEST_MCP", marker)) == 2
    task = asyncio.create_task(close())
    await asyncio.sleep(0)  # its first step: the closes are handed out, then it is cancelled
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(10):
        while left := marked("AF_TEST_MCP", marker):  # noqa: ASYNC110 (processes, no event)
            await asyncio.sleep(0.05)
        # The closes go on after the cancel: let them end (each waits for its process).
        while [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert left == []


def _slow_to_start(name: str, script: str, marker: str) -> MCPServerStdio:
    """A test server that starts half a second after its process does (marked `marker`)."""
    return MCPServerStdio(
        name=name,
        command="/bin/sh",
        args=("-c", f"sleep 0.5; exec {sys.executable} {MCP_SERVERS / script}"),
        env={"AF_TEST_MCP": marker},
    )


async def _until(found: bool, marker: str) -> None:
    """Wait until a process marked `marker` runs (`found`), or none does."""
    async with asyncio.timeout(10):
        while bool(marked("AF_TEST_MCP", marker)) is not found:  # noqa: ASYNC110 (processes)
            await asyncio.sleep(0.01)


async def test_a_close_while_a_call_restarts_the_server_stops_the_new_one() -> None:
    marker = f"close-in-restart-{os.getpid()}"
    connection = MCPConnection(_slow_to_start("crashy", "crash_server.py", marker))
    await connection.start()
    assert (await connection.call_tool("crash", {})).error_kind == "server_unavailable"
    await _until(False, marker)
    calling = asyncio.create_task(connection.call_tool("echo", {"text": "hi"}))
    await _until(True, marker)  # the restart's process, not answering yet
    await connection.aclose()
    result = await calling
    assert result.error_kind == "server_unavailable"
    assert result.content == "MCP connection 'crashy' is closed"
    assert not connection.connected
    await _until(False, marker)


async def test_an_agent_closed_while_it_starts_its_servers_leaves_none_running() -> None:
    from agent_flow.agent import AgentExecutor
    from agent_flow.config import AgentConfig
    from agent_flow.testing import ScriptedLLM

    marker = f"close-in-start-{os.getpid()}"
    config = AgentConfig(mcp_servers=[_slow_to_start("slow", "basic_server.py", marker)])
    agent = AgentExecutor(ScriptedLLM([]), config=config)
    starting = asyncio.create_task(agent.start())
    await _until(True, marker)
    await agent.aclose()  # a shutdown, say, while the agent starts
    await starting
    assert dict(agent.mcp_tools) == {}
    await _until(False, marker)
