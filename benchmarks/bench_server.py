"""`agent-flow serve` under load: N sessions at once, each a 10-step tool loop, all streamed.

A local OpenAI-compatible server (tests/openai_server.py) answers instantly: the model calls
``add`` ten times, then answers. Two ways to drive N concurrent sessions, each in its own
child process:

- in-process (the baseline): N `AgentExecutor`s with a session store, one subscriber each;
- http: the app of `agent-flow serve` on uvicorn (with the model server in the same process,
  as in the baseline); a separate driver process creates N sessions over HTTP, opens N SSE
  streams, sends N messages and reads every stream to its ``run_finished``.

Reported: runs/s; CPU per model turn of the process that runs the agents (the server's, read
from /proc; the driver's own parsing is not counted); event delivery latency p50/p99 (the
event's timestamp to the moment the client parsed it); RSS growth per session; and whether
every stream was complete and in order (ids 0..n-1, no gap, no duplicate).

Usage: python benchmarks/bench_server.py [--sessions 10,100,500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.openai_server import OpenAIServer, Reply, sse_reply, text_chunks, tool_call_chunks

K = 10
TURNS = K + 1


def make_handler() -> Any:
    calls = [
        sse_reply(tool_call_chunks([(f"call_{n}", "add", json.dumps({"a": n, "b": 1}))]))
        for n in range(K)
    ]
    final = sse_reply(text_chunks("Done."))

    def handler(request: Any) -> Reply:
        messages = json.loads(request.raw_body)["messages"]
        done = sum(1 for m in messages if m["role"] == "tool")
        return calls[done] if done < K else final

    return handler


def config_and_tools() -> tuple[Any, Any]:
    from agent_flow import AgentConfig, ContextConfig
    from agent_flow.tools import ToolExecutor, tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    config = AgentConfig(
        system_prompt="You are a calculator agent. Use the add tool.\n{environment}",
        context=ContextConfig(max_tokens=64_000),
        max_iterations=1000,
        stuck_threshold=1000,
    )

    def tools(_: Any) -> Any:
        executor = ToolExecutor()
        executor.register(add)
        return executor

    return config, tools


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _latency_ms(timestamp: str, received: float) -> float:
    created = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    return (received - created) * 1000


# -- in-process baseline ---------------------------------------------------------------


async def in_process(n: int) -> dict[str, Any]:
    from agent_flow import AgentExecutor, OpenAIClient
    from agent_flow.sessions import InMemorySessionStore

    config, tools = config_and_tools()
    async with OpenAIServer(handler=make_handler()) as server:
        server.record = False
        client = OpenAIClient("m", base_url=server.base_url, api_key="k")
        store = InMemorySessionStore()
        latencies: list[float] = []
        complete = True

        async def one() -> None:
            nonlocal complete
            agent = AgentExecutor(client, config=config, tools=tools(None), store=store)
            subscription = agent.subscribe()

            async def drain() -> list[int]:
                seqs = []
                async for event in subscription:
                    latencies.append((time.time() - event.timestamp.timestamp()) * 1000)
                    seqs.append(event.seq)
                return seqs

            reader = asyncio.create_task(drain())
            outcome = await agent.run("Add the numbers.")
            seqs = await reader
            complete = complete and outcome.iterations == TURNS and seqs == list(range(len(seqs)))

        await one()  # warm-up
        latencies.clear()
        rss0 = _rss_mb(os.getpid())
        cpu0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        elapsed = time.perf_counter() - start
        cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - cpu0
        rss = _rss_mb(os.getpid()) - rss0
    return _summary(n, elapsed, cpu, rss, latencies, complete)


# -- over HTTP -------------------------------------------------------------------------


async def serve(port_file: str) -> None:
    import uvicorn

    from agent_flow import OpenAIClient
    from agent_flow.server import create_app
    from agent_flow.sessions import InMemorySessionStore

    config, tools = config_and_tools()
    async with OpenAIServer(handler=make_handler()) as server:
        server.record = False
        client = OpenAIClient("m", base_url=server.base_url, api_key="k")
        app = create_app(
            config,
            store=InMemorySessionStore(),
            llm_factory=lambda _: client,
            tools_factory=tools,
        )
        # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto
        # says TCP, and without it Nagle's algorithm meets the client's delayed ACK (~40 ms).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(4096)
        Path(port_file).write_text(str(sock.getsockname()[1]))  # noqa: ASYNC240 (once, tiny)
        await uvicorn.Server(
            uvicorn.Config(app, log_level="warning", backlog=4096, timeout_keep_alive=60)
        ).serve(sockets=[sock])


async def drive(base: str, pid: int, n: int) -> dict[str, Any]:
    import httpx2

    limits = httpx2.Limits(max_connections=2 * n + 20, max_keepalive_connections=2 * n + 20)
    latencies: list[float] = []
    complete = True
    async with httpx2.AsyncClient(base_url=base, timeout=None, limits=limits) as client:

        async def one(session: str) -> None:
            nonlocal complete
            ids: list[int] = []
            async with client.stream("GET", f"/sessions/{session}/events") as response:
                await client.post(f"/sessions/{session}/messages", json={"message": "Add."})
                finished = False
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        latencies.append(_latency_ms(event["timestamp"], time.time()))
                    elif line.startswith("id: "):
                        ids.append(int(line[4:]))
                        if finished:  # the id line follows the last event's data
                            break
                    elif line == "event: run_finished":
                        finished = True
            complete = complete and ids == list(range(len(ids))) and len(ids) > TURNS

        warm = (await client.post("/sessions", json={})).json()["id"]
        await one(warm)
        latencies.clear()
        sessions = [(await client.post("/sessions", json={})).json()["id"] for _ in range(n)]
        rss0, cpu0 = _rss_mb(pid), _cpu_seconds(pid)
        start = time.perf_counter()
        await asyncio.gather(*(one(session) for session in sessions))
        elapsed = time.perf_counter() - start
        cpu, rss = _cpu_seconds(pid) - cpu0, _rss_mb(pid) - rss0
    return _summary(n, elapsed, cpu, rss, latencies, complete)


def over_http(n: int) -> dict[str, Any]:
    port_file = Path(f"/tmp/bench_server_{os.getpid()}.port")
    port_file.unlink(missing_ok=True)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)])
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port_file.read_text()}"
        return asyncio.run(drive(base, server.pid, n))
    finally:
        server.terminate()
        server.wait()
        port_file.unlink(missing_ok=True)


def _summary(
    n: int, elapsed: float, cpu: float, rss: float, latencies: list[float], complete: bool
) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "runs_per_s": n / elapsed,
        "cpu_ms_per_turn": cpu * 1000 / (n * TURNS),
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "rss_kb_per_session": rss * 1024 / n,
        "events": len(latencies),
        "complete": complete,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", default="10,100,500", help="concurrent sessions")
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--in-process", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    if args.in_process:
        print(json.dumps(asyncio.run(in_process(args.in_process))))
        return
    print(f"{K}-step tool loops, N sessions at once; http = agent-flow serve + SSE clients")
    head = f"{'N':>4} {'mode':>10} | {'runs/s':>7} | {'CPU ms/turn':>11} | {'p50 ms':>7} |"
    print(head + f" {'p99 ms':>7} | {'RSS KB/sess':>11} | {'events':>7} | complete")
    for n in (int(value) for value in args.sessions.split(",")):
        baseline_out = subprocess.run(
            [sys.executable, __file__, "--in-process", str(n)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        baseline = json.loads(baseline_out.strip().splitlines()[-1])
        http = over_http(n)
        for mode, row in (("in-process", baseline), ("http", http)):
            print(
                f"{n:>4} {mode:>10} | {row['runs_per_s']:>7.1f} |"
                f" {row['cpu_ms_per_turn']:>11.2f} |"
                f" {row['p50_ms']:>7.2f} | {row['p99_ms']:>7.2f} |"
                f" {row['rss_kb_per_session']:>11.0f}"
                f" | {row['events']:>7} | {row['complete']}"
            )
        overhead = http["cpu_ms_per_turn"] / baseline["cpu_ms_per_turn"] - 1
        print(f"{'':>4} {'':>10}   HTTP+SSE CPU overhead per turn: {overhead:+.0%}")


if __name__ == "__main__":
    main()
