"""Client CPU per model turn of agent_flow and of peer frameworks, measured in the same run.

The workload is `bench_loop.py`'s, imported from it: the local OpenAI-compatible server of
tests/openai_server.py, in the same process, scripted so that the model calls ``add`` K
times and then answers "Done."; its ``handwritten`` loop (a plain `AsyncOpenAI` ``while``
loop) is the baseline, its ``agent_flow`` loop (`AgentExecutor` with `OpenAIClient`, events
on with a subscriber, the defaults) is ours. The server's cost is in every column, as in
bench_loop, so the handwritten and agent_flow figures compare with bench_loop's. Each peer
runs the same tool loop the way its docs show one, with one function tool ``add(a, b)``:

- OpenAI Agents SDK: `Agent` + `function_tool`, `OpenAIChatCompletionsModel` over an
  `AsyncOpenAI`, `Runner.run` / `Runner.run_streamed` (events read), tracing disabled;
- PydanticAI: `Agent` with `OpenAIChatModel` + `OpenAIProvider`, `agent.run` /
  `agent.run_stream_events` (events read);
- LangGraph: `create_react_agent` with `ChatOpenAI`, ``ainvoke`` / ``astream`` in
  ``messages`` mode (tokens read).

Every run of every loop is checked to have made K tool calls and got the final answer, so
no loop is measured doing less work. The time per model turn is CPU time of the process
(``time.process_time``); each cell runs in its own child process where the loops take turns,
one block of runs each per round in a rotating order, and reports the median over rounds
and the median of each round's ratio to the handwritten loop of the same round. A peer that
is not importable is skipped with a note; peers live in their own venv, never in
agent_flow's dependencies::

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install -e '.[dev]' openai-agents \\
        'pydantic-ai-slim[openai]' langgraph langchain-openai
    /tmp/peers/bin/python benchmarks/bench_peers.py [--runs 20] [--rounds 4] [--concurrent 100]

Nothing leaves the machine: the peers' telemetry is turned off by the environment variables
they document, and a guard in each child refuses to resolve any host but the loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# Before any peer is imported: the switches the peers read to turn tracing and telemetry off
# (openai-agents, langsmith under both its prefixes, OpenTelemetry, logfire), a dummy key.
os.environ.update(
    {
        "OPENAI_API_KEY": "dummy",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "LANGSMITH_TRACING_V2": "false",
        "LANGCHAIN_TRACING": "false",
        "OTEL_SDK_DISABLED": "true",
        "LOGFIRE_SEND_TO_LOGFIRE": "false",
    }
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench_rounds import interleaved
from bench_loop import SYSTEM, add, agent_flow_run, block, handwritten_run, make_handler

from tests.openai_server import OpenAIServer

PROMPT = "Add the numbers."
FINAL = "Done."
# Each peer with the modules it needs (its distribution: openai-agents, pydantic-ai-slim[openai],
# langgraph + langchain-openai).
PEERS = {
    "openai_agents": ("agents",),
    "pydantic_ai": ("pydantic_ai",),
    "langgraph": ("langgraph", "langchain_openai"),
}
LOOPS = ("handwritten", "agent_flow", *PEERS)
DISTRIBUTIONS = ("openai", "openai-agents", "pydantic-ai-slim", "langgraph", "langchain-openai")


def loopback_only() -> None:
    """Refuse to resolve any host but the loopback, so nothing a peer does leaves the machine."""
    resolve = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in (None, "127.0.0.1", "localhost", "::1", b"127.0.0.1", b"localhost"):
            raise OSError(f"bench_peers: refused to resolve {host!r} (loopback only)")
        return resolve(host, *args, **kwargs)

    socket.getaddrinfo = guarded


def installed(distribution: str) -> bool:
    """Whether the distribution is installed (its version can be printed)."""
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def missing(loop: str) -> list[str]:
    """The modules the loop needs that this interpreter cannot import (none for ours)."""
    return [name for name in PEERS.get(loop, ()) if importlib.util.find_spec(name) is None]


def checked(loop: str, tool_results: int, text: str, k: int) -> int:
    """The run's model turns, after checking it made K tool calls and got the final answer."""
    assert tool_results == k, f"{loop}: {tool_results} tool results, expected {k}"
    assert text == FINAL, f"{loop}: final answer {text!r}, expected {FINAL!r}"
    return k + 1


# --- OpenAI Agents SDK -------------------------------------------------------------------


def openai_agents_loop(base_url: str, k: int, stream: bool) -> Callable[[], Awaitable[int]]:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.items import ToolCallOutputItem
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="k")
    agent = Agent(
        name="calculator",
        instructions=SYSTEM,
        model=OpenAIChatCompletionsModel(model="m", openai_client=client),
        tools=[function_tool(add)],
    )
    max_turns = k + 5  # the default (10) stops a K=10 run before its answer

    async def run() -> int:
        if stream:
            result: Any = Runner.run_streamed(agent, PROMPT, max_turns=max_turns)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, PROMPT, max_turns=max_turns)
        outputs = sum(isinstance(item, ToolCallOutputItem) for item in result.new_items)
        return checked("openai_agents", outputs, result.final_output, k)

    return run


# --- PydanticAI --------------------------------------------------------------------------


def pydantic_ai_loop(base_url: str, k: int, stream: bool) -> Callable[[], Awaitable[int]]:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent, AgentRunResultEvent
    from pydantic_ai.messages import ModelRequest, ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    client = AsyncOpenAI(base_url=base_url, api_key="k")
    model = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, instructions=SYSTEM, tools=[add])
    limits = UsageLimits(request_limit=k + 5)  # the default (50) stops a K=100 run

    async def run() -> int:
        if stream:
            result: Any = None
            async with agent.run_stream_events(PROMPT, usage_limits=limits) as events:
                async for event in events:
                    if isinstance(event, AgentRunResultEvent):
                        result = event.result
        else:
            result = await agent.run(PROMPT, usage_limits=limits)
        returns = sum(
            isinstance(part, ToolReturnPart)
            for message in result.all_messages()
            if isinstance(message, ModelRequest)
            for part in message.parts
        )
        return checked("pydantic_ai", returns, result.output, k)

    return run


# --- LangGraph ---------------------------------------------------------------------------


def langgraph_loop(base_url: str, k: int, stream: bool) -> Callable[[], Awaitable[int]]:
    from langchain_core.messages import ToolMessage
    from langchain_openai import ChatOpenAI

    with warnings.catch_warnings():
        # Moved to `langchain.agents.create_agent`, which needs the `langchain` package too;
        # langgraph's own prebuilt agent is the same loop.
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        model = ChatOpenAI(model="m", base_url=base_url, api_key="k", streaming=stream)
        agent = create_react_agent(model, [add], prompt=SYSTEM)
    # Each step (model, tools) is a super-step: 2K + 1 of them, past the default of 25.
    config = {"recursion_limit": 2 * k + 10}
    inputs = {"messages": [("user", PROMPT)]}

    async def run() -> int:
        if stream:
            state: Any = None
            async for mode, chunk in agent.astream(
                inputs, config, stream_mode=["messages", "values"]
            ):
                if mode == "values":
                    state = chunk
        else:
            state = await agent.ainvoke(inputs, config)
        messages = state["messages"]
        results = sum(isinstance(message, ToolMessage) for message in messages)
        return checked("langgraph", results, messages[-1].content, k)

    return run


PEER_LOOPS = {
    "openai_agents": openai_agents_loop,
    "pydantic_ai": pydantic_ai_loop,
    "langgraph": langgraph_loop,
}


@asynccontextmanager
async def serving(
    stream: bool, k: int, loops: tuple[str, ...]
) -> AsyncIterator[Callable[[str], Awaitable[int]]]:
    """bench_loop's server scripted for K-step runs, and ``one(loop)``: one checked run."""
    from openai import AsyncOpenAI

    from agent_flow import OpenAIClient

    async with OpenAIServer(handler=make_handler(k, stream)) as server:
        server.record = False
        # Every loop reuses its client (and the peers their agent) across runs.
        client = AsyncOpenAI(base_url=server.base_url, api_key="k")
        ours = OpenAIClient("m", base_url=server.base_url, api_key="k")
        peers = {
            loop: PEER_LOOPS[loop](server.base_url, k, stream) for loop in loops if loop in PEERS
        }

        async def one(loop: str) -> int:
            if loop == "handwritten":
                turns = await handwritten_run(client, stream)
                assert turns == k + 1, f"handwritten: {turns} turns, expected {k + 1}"
                return turns
            if loop == "agent_flow":
                # agent_flow_run asserts the final answer; K + 1 iterations means K tool steps.
                turns = await agent_flow_run(ours, stream)
                assert turns == k + 1, f"agent_flow: {turns} turns, expected {k + 1}"
                return turns
            return await peers[loop]()

        yield one


async def measure_rounds(
    stream: bool, k: int, runs: int, concurrent: bool, rounds: int, loops: tuple[str, ...]
) -> dict[str, Any]:
    """The loops in one process, interleaved: `rounds` rounds of one block per loop.

    The order rotates from round to round so that every loop meets the same machine. Returns,
    per loop, the median CPU ms per turn over the rounds and the median of each round's
    ratio to the handwritten loop's block of the same round.
    """
    per_round: dict[str, list[float]] = {loop: [] for loop in loops}
    async with serving(stream, k, loops) as one:
        for loop in loops:  # warm-up: imports, connections, tokenizer
            await one(loop)
        for loop in interleaved(loops, rounds):
            cpu, _, _ = await block(one, loop, runs, concurrent)
            per_round[loop].append(cpu)
    base = per_round["handwritten"]
    return {
        loop: {
            "ms_per_turn": statistics.median(values),
            "ratio": statistics.median(v / b for v, b in zip(values, base, strict=True)),
        }
        for loop, values in per_round.items()
    }


def machine() -> str:
    """The load averages (1, 5, 15 min) and the core count, as the kernel reports them now."""
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return f"load {load} on {os.cpu_count()} cores"


def run_cell(
    stream: bool, k: int, runs: int, concurrent: bool, rounds: int, loops: tuple[str, ...]
) -> dict[str, Any]:
    """One cell of the table, in a fresh process."""
    command = [sys.executable, __file__, "--child", "--k", str(k), "--runs", str(runs)]
    command += ["--rounds", str(rounds), "--loops", ",".join(loops)]
    command += ["--stream"] * stream + ["--concurrent-mode"] * concurrent
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--runs", type=int, default=20, help="sequential K=10 runs per block (K=100: runs/20)"
    )
    parser.add_argument("--concurrent", type=int, default=100, help="runs at once")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per cell")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--loops", default=",".join(LOOPS), help=argparse.SUPPRESS)
    parser.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--concurrent-mode", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        loopback_only()
        loops = tuple(args.loops.split(","))
        cell = measure_rounds(
            args.stream, args.k, args.runs, args.concurrent_mode, args.rounds, loops
        )
        print(json.dumps(asyncio.run(cell)))
        return

    versions = ", ".join(f"{name} {version(name)}" for name in DISTRIBUTIONS if installed(name))
    print(f"Python {sys.version.split()[0]}; {versions}")
    loops = tuple(loop for loop in LOOPS if not missing(loop))
    for loop in LOOPS:
        if loop not in loops:
            print(f"skipped {loop}: {', '.join(missing(loop))} not importable by {sys.executable}")
    cells = (
        ("K=10 seq", False, 10, args.runs, False, args.rounds),
        ("K=10 seq, streamed", True, 10, args.runs, False, args.rounds),
        ("K=10 at 100 concurrent", False, 10, args.concurrent, True, max(args.rounds // 2, 2)),
        # A K=100 run is 10x the turns, each carrying up to 10x the history: fewer runs, rounds.
        ("K=100 seq", False, 100, max(args.runs // 20, 1), False, max(args.rounds - 1, 2)),
    )
    results: dict[str, dict[str, Any]] = {}
    for label, stream, k, runs, concurrent, rounds in cells:
        start = machine()
        result = run_cell(stream, k, runs, concurrent, rounds, loops)
        results[label] = result
        print(f"{label} ({runs} runs x {rounds} rounds): {start} -> {machine()}", flush=True)
        for loop in loops:
            cpu, ratio = result[loop]["ms_per_turn"], result[loop]["ratio"]
            print(f"  {loop:<14} {cpu:8.3f} ms/turn  {ratio:5.2f}x handwritten", flush=True)
    print()
    print("| loop | " + " | ".join(results) + " |")
    print("|---" * (len(results) + 1) + "|")
    for loop in loops:
        row = [
            f"{r[loop]['ms_per_turn']:.2f} ms ({r[loop]['ratio']:.2f}x)" for r in results.values()
        ]
        print(f"| {loop} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
