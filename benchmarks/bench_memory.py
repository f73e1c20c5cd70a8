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

Usage: python benchmarks/bench_memory.py [--concurrent 100] [--k 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tracemalloc
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
    else:
        from agent_flow import AgentExecutor, OpenAIClient  # noqa: F401
    after_import = rss_mb()

    import bench_loop
    from openai import AsyncOpenAI, Timeout

    from agent_flow import OpenAIClient as Client
    from tests.openai_server import OpenAIServer

    async def measure() -> dict[str, Any]:
        async with OpenAIServer(handler=bench_loop.make_handler(k, False)) as server:
            server.record = False
            # tracemalloc slows everything down: generous connect timeouts on a loaded machine.
            plain = AsyncOpenAI(base_url=server.base_url, api_key="k", timeout=Timeout(300.0))
            ours = Client("m", base_url=server.base_url, api_key="k", connect_timeout=300.0)

            async def one() -> int:
                if loop == "handwritten":
                    return await bench_loop.handwritten_run(plain, False)
                return await bench_loop.agent_flow_run(ours, False)

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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.k, args.concurrent)))
        return
    print(f"K={args.k}, {args.concurrent} runs in flight; MB are RSS, KB Python allocations")
    print(f"{'loop':<12} {'RSS after import':>16} {'RSS warm':>9} {'KB per run in flight':>21}")
    results = {}
    for loop in ("handwritten", "agent_flow"):
        command = [sys.executable, __file__, "--child", loop, "--k", str(args.k)]
        command += ["--concurrent", str(args.concurrent)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {loop} child failed:\n{done.stderr}")
        output = done.stdout
        result = results[loop] = json.loads(output.strip().splitlines()[-1])
        print(
            f"{loop:<12} {result['after_import_mb']:>13.1f} MB {result['warm_mb']:>6.1f} MB "
            f"{result['per_run_kb']:>18.1f} KB",
            flush=True,
        )
    extra = results["agent_flow"]["after_import_mb"] - results["handwritten"]["after_import_mb"]
    warm = results["agent_flow"]["warm_mb"] - results["handwritten"]["warm_mb"]
    print(f"agent_flow - handwritten: {extra:+.1f} MB after import, {warm:+.1f} MB warm")


if __name__ == "__main__":
    main()
