"""Helpers shared by the test modules (fixtures shared by them are in ``conftest.py``).

Each used to be copied into several test files: tool-call builders, the MCP test servers'
configs, the small agent most loop tests run, and the checks every transcript must pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

from agent_flow._types import JsonValue
from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.history import HistoryEntry, ToolCallEntry, ToolResultEntry, build_units
from agent_flow.llm.base import StreamEvent
from agent_flow.messages import ToolCall
from agent_flow.tokens import TokenCounter
from agent_flow.tools import MCPServerStdio, Tool, ToolPolicy, tool

#: The MCP servers the tests start (``tests/mcp_servers/``).
MCP_SERVERS = Path(__file__).parent / "mcp_servers"


def tool_call(name: str, arguments: str | JsonValue = "{}", call_id: str = "1") -> ToolCall:
    """A model's call of `name`; `arguments` as the raw JSON text, or data to encode."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id=call_id, name=name, arguments=raw)


class FakeClock:
    """Monotonic seconds a test moves itself (``clock.now += 1.6``): a time window measured
    without waiting for it, and without a slow machine's calls eating into it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stdio_server(name: str, script: str, **options: Any) -> MCPServerStdio:
    """The config of one of the test MCP servers, run over stdio with this Python.

    Most test servers' tools carry no annotations, which makes them high-risk by the MCP
    spec's defaults (needing approval); tests not about policy trust them (``policy``
    defaults to a plain `ToolPolicy`; pass ``policy=None`` for the hints' policy).
    """
    options.setdefault("policy", ToolPolicy())
    return MCPServerStdio(
        name=name, command=sys.executable, args=(str(MCP_SERVERS / script),), **options
    )


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def make_agent(llm: Any, *tools: Tool, **config: Any) -> AgentExecutor:
    """An agent on `llm` with the `add` tool (and `tools`) and a small approximate budget.

    Args:
        llm: The model (usually a `ScriptedLLM` or `FunctionLLM`).
        tools: More tools to register.
        config: `AgentConfig` fields; ``context`` defaults to 8,000 approximately counted
            tokens.
    """
    context = config.pop("context", ContextConfig(max_tokens=8000, counter="approx"))
    agent = AgentExecutor(llm, config=AgentConfig(context=context, **config))
    for extra in (add, *tools):
        agent.tools.register(extra)
    return agent


def assert_history_consistent(agent: AgentExecutor) -> None:
    """Every tool call in the agent's history has its result, and every result its call."""
    calls = {e.call_id for e in agent.history.entries if isinstance(e, ToolCallEntry)}
    results = {e.call_id for e in agent.history.entries if isinstance(e, ToolResultEntry)}
    assert calls == results


async def drain_into(events: AsyncIterator[StreamEvent], seen: list[StreamEvent]) -> None:
    """Consume a model stream, keeping what arrived (also when the consumer is cancelled)."""
    async for event in events:
        seen.append(event)


def unit_groups(
    entries: list[HistoryEntry], cuts: list[int], counter: TokenCounter
) -> list[list[HistoryEntry]]:
    """Split `entries` into steps of whole units: `cuts` says how many units each step adds."""
    units = build_units(entries, counter)
    groups: list[list[HistoryEntry]] = []
    start = 0
    for cut in [*cuts, len(units)]:
        end = min(len(units), start + cut)
        groups.append([e for u in units[start:end] for e in u.entries])
        start = end
    return groups


@contextlib.asynccontextmanager
async def http_mcp_server(script: str, log_path: Path) -> AsyncIterator[str]:
    """Run a test MCP server (tests/mcp_servers/`script`) over streamable HTTP; yield its URL."""
    with log_path.open("w") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(MCP_SERVERS / script),
            "http",
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        try:
            assert process.stdout is not None
            async with asyncio.timeout(30):
                port = int(await process.stdout.readline())
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()


def run_python(code: str, *, env: dict[str, str] | None = None) -> None:
    """Run `code` in a fresh interpreter (this one's); fail with its stderr if it fails.

    `env` is added to this process's environment.
    """
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env} if env else None,
    )
    assert result.returncode == 0, result.stderr


async def start_http_server(
    log: TextIO, port: int | None = None
) -> tuple[int, asyncio.subprocess.Process]:
    """Start the basic MCP server over HTTP (on `port`, else a free one): its port and process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(MCP_SERVERS / "basic_server.py"),
        "http",
        *([] if port is None else [str(port)]),
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    assert process.stdout is not None
    async with asyncio.timeout(30):
        return int(await process.stdout.readline()), process


async def stop_process(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
    await process.wait()
