"""Memory: RSS after import and per run in flight, agent_flow beside the plain loop.

The same workload as `bench_loop` (K tool steps per run against the local instant server).
Each loop runs in its own child process:

- RSS after import: the process's resident memory once the loop's modules are imported
  (the plain loop imports the openai SDK; agent_flow imports its agent and `OpenAIClient`);
- after warm-up: the same once one run has finished (connections, tokenizer ranks, price
  data and schemas loaded);
- per run in flight: N runs started at once (``asyncio.gather``: all N are in flight
  together), the peak of Python allocations during them (tracemalloc) above the level before,
  divided by N. tracemalloc sees Python allocations only, which is what a run holds (its
  history, environment, events, buffers).

Each child imports only what its loop needs: the plain loop's never imports agent_flow (before
2026-11-28 it did, when it built both clients, and its warm figure carried agent_flow's
modules). The peers of `bench_peers.py` (OpenAI Agents SDK, PydanticAI, LangGraph) are
measured the same way where they are importable (their own venv; see `bench_peers.py`), each
running its documented tool loop.

Usage: python benchmarks/bench_memory.py [--concurrent 100] [--k 10] [--loops L1,L2,...]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import subprocess
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    """The resident memory of this process now, in MB (Linux)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096 / 2**20


def child(loop: str, k: int, concurrent: int) -> dict[str, Any]:
    if loop == "handwritten":
        import openai  # noqa: F401  (what the plain loop imports)
    elif loop == "agent_flow":
        from agent_flow import AgentExecutor, OpenAIClient  # noqa: F401
    else:
        import bench_peers

        bench_peers.loopback_only()
        for name in bench_peers.PEERS[loop]:
            importlib.import_module(name)
    after_import = rss_mb()

    import bench_loop
    from openai import AsyncOpenAI, Timeout

    from tests.openai_server import OpenAIServer

    async def measure() -> dict[str, Any]:
        async with OpenAIServer(handler=bench_loop.make_handler(k, False)) as server:
            server.record = False
            one: Callable[[], Awaitable[int]]
            if loop == "handwritten":
                # tracemalloc slows everything down: generous timeouts on a loaded machine.
                plain = AsyncOpenAI(base_url=server.base_url, api_key="k", timeout=Timeout(300.0))

                def one() -> Awaitable[int]:
                    return bench_loop.handwritten_run(plain, False)

            elif loop == "agent_flow":
                from agent_flow import OpenAIClient

                ours = OpenAIClient(
                    "m", base_url=server.base_url, api_key="k", connect_timeout=300.0
                )

                def one() -> Awaitable[int]:
                    return bench_loop.agent_flow_run(ours, False)

            else:
                import bench_peers

                one = bench_peers.PEER_LOOPS[loop](server.base_url, k, False)

            await one()
            await one()
            warm = rss_mb()
            tracemalloc.start()
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            await asyncio.gather(*(one() for _ in range(concurrent)))
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            return {
                "after_import_mb": after_import,
                "warm_mb": warm,
                "per_run_kb": (peak - before) / concurrent / 1024,
            }

    return asyncio.run(measure())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--concurrent", type=int, default=100, help="runs in flight at once")
    parser.add_argument("--k", type=int, default=10, help="tool steps per run")
    parser.add_argument("--loops", help="comma-separated (default: ours, the plain loop, peers)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.k, args.concurrent)))
        return
    import bench_peers  # (it turns the peers' telemetry off in this process and its children)

    wanted = args.loops.split(",") if args.loops else bench_peers.LOOPS
    loops = [loop for loop in wanted if not bench_peers.missing(loop)]
    print(f"K={args.k}, {args.concurrent} runs in flight; MB are RSS, KB Python allocations")
    print(bench_peers.machine())
    print(
        f"{'loop':<14} {'RSS after import':>16} {'RSS warm':>9} {'over plain':>10} "
        f"{'KB per run in flight':>21}"
    )
    results = {}
    for loop in loops:
        command = [sys.executable, __file__, "--child", loop, "--k", str(args.k)]
        command += ["--concurrent", str(args.concurrent)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {loop} child failed:\n{done.stderr}")
        output = done.stdout
        result = results[loop] = json.loads(output.strip().splitlines()[-1])
        plain = results.get("handwritten", {}).get("warm_mb")
        over = f"{result['warm_mb'] - plain:+.1f} MB" if plain is not None else "-"
        print(
            f"{loop:<14} {result['after_import_mb']:>13.1f} MB {result['warm_mb']:>6.1f} MB "
            f"{over:>10} {result['per_run_kb']:>18.1f} KB",
            flush=True,
        )
    for loop in wanted:
        if loop not in loops:
            print(f"{loop}: skipped, not importable here ({', '.join(bench_peers.missing(loop))})")
    if "handwritten" in results and "agent_flow" in results:
        plain_loop, ours = results["handwritten"], results["agent_flow"]
        extra = ours["after_import_mb"] - plain_loop["after_import_mb"]
        warm = ours["warm_mb"] - plain_loop["warm_mb"]
        print(f"agent_flow - handwritten: {extra:+.1f} MB after import, {warm:+.1f} MB warm")


if __name__ == "__main__":
    main()
