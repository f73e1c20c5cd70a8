"""What running a sync tool in a thread costs a turn: agent_flow's tool threads against
`asyncio.to_thread`, with an async tool as the floor.

`bench_loop`'s workload (its local instant server, runs of K ``add`` steps then an answer,
one subscriber reading the events) with three variants of the agent, taking turns round by
round in one process (rotating order; the median of the rounds):

- ``pool``: the default, ``add`` a plain sync function run on agent_flow's tool threads
  (`agent_flow.tools._threads`);
- ``to_thread``: the same with each call handed to `asyncio.to_thread` instead (the loop's
  default pool, as before);
- ``async``: ``add`` written as an async function: no thread at all.

Two cells: runs one after another, and 100 runs at once. CPU ms per model turn of the process.

Usage: python benchmarks/bench_tool_threads.py [--rounds 10] [--runs 30] [--k 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_loop
from _bench_rounds import interleaved

import agent_flow.tools.base as tool_base
from agent_flow.tools import tool


async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


ASYNC_ADD = tool(add, name="add")


class _ToThread:
    """`asyncio.to_thread` in the shape of the tool threads' ``run``."""

    async def run(self, function: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(function, *args, **kwargs)


POOL = tool_base.tool_threads
VARIANTS = ("pool", "to_thread", "async")


SYNC_ADD = bench_loop.add_tool()


async def one_run(client: Any, stream: bool, variant: str) -> int:
    """`bench_loop.agent_flow_run` with `variant`'s ``add`` and thread hand-off."""
    tool_base.tool_threads = (lambda: _ToThread()) if variant == "to_thread" else POOL  # type: ignore[assignment]
    bench_loop._tools[:] = [ASYNC_ADD if variant == "async" else SYNC_ADD]
    return int(await bench_loop.agent_flow_run(client, stream))


async def cell(concurrent: bool, args: argparse.Namespace) -> dict[str, float]:
    from agent_flow import OpenAIClient
    from tests.openai_server import OpenAIServer

    async with OpenAIServer(handler=bench_loop.make_handler(args.k, False)) as server:
        server.record = False
        client = OpenAIClient("m", base_url=server.base_url, api_key="k")
        for variant in VARIANTS:  # warm-up
            await one_run(client, False, variant)
        samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for variant in interleaved(VARIANTS, args.rounds):
            started, turns = time.process_time(), 0
            if concurrent:
                runs = [one_run(client, False, variant) for _ in range(100)]
                turns = sum(await asyncio.gather(*runs))
            else:
                for _ in range(args.runs):
                    turns += await one_run(client, False, variant)
            samples[variant].append((time.process_time() - started) * 1000 / turns)
        await client.aclose()
    return {variant: statistics.median(values) for variant, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=30, help="runs per block, one at a time")
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    print(
        f"K={args.k}, not streamed, {args.rounds} rounds; load {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} cores; CPU ms per model turn (median of rounds)"
    )
    print(f"{'runs':<22}{'pool':>8}{'to_thread':>11}{'async':>8}")
    for concurrent, label in ((False, f"{args.runs} one at a time"), (True, "100 at once")):
        result = asyncio.run(cell(concurrent, args))
        pool, to_thread, floor = (result[variant] for variant in VARIANTS)
        print(f"{label:<22}{pool:>8.3f}{to_thread:>11.3f}{floor:>8.3f}")


if __name__ == "__main__":
    main()
