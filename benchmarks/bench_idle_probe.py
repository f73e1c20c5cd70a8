"""What the SDK's connection pool costs a turn with many runs at once: agent_flow's (its idle
check, `llm/_idle_probe.py`, and its shards, `llm/_pool_shards.py`) against the SDK's own.

`bench_loop`'s workload (its local instant server, runs of K ``add`` steps then an answer,
one subscriber reading the events), the same agent on two `OpenAIClient`s taking turns round
by round in one process (rotating order; the median of the rounds):

- ``ours``: the default, an `OpenAIClient` that made its own `AsyncOpenAI` (its pool split in
  shards, which check idle connections from a socket looked up once per connection);
- ``unsplit``: the same with the SDK's one pool (the idle check alone);
- ``sdk``: an `OpenAIClient` given an `AsyncOpenAI` made as the SDK makes it (httpcore2 asks
  anyio for the socket at every check).

The pool walks every connection it holds, and checks every idle one, whenever a request
starts or ends, so the differences grow with the runs at once; one run at a time has a single
connection and none. CPU ms per model turn of the process, not streamed and streamed, and
the connections each variant made in all (a pool that keeps fewer alive than it needs
closes and makes them again: against a real provider, a TLS handshake each).

Usage: python benchmarks/bench_idle_probe.py [--rounds 6] [--at-once 1,100,300] [--k 10]
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

VARIANTS = ("ours", "unsplit", "sdk")


async def cell(
    at_once: int, stream: bool, args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, int]]:
    from openai import AsyncOpenAI

    from agent_flow import OpenAIClient
    from agent_flow.llm._idle_probe import quicken
    from tests.openai_server import OpenAIServer

    async with OpenAIServer(handler=bench_loop.make_handler(args.k, stream)) as server:
        server.record = False
        clients: dict[str, Any] = {
            "ours": OpenAIClient("m", base_url=server.base_url, api_key="k"),
            "unsplit": OpenAIClient(
                "m",
                sdk_client=AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0),
            ),
            "sdk": OpenAIClient(
                "m",
                sdk_client=AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0),
            ),
        }
        quicken(clients["unsplit"].sdk_client)
        made = dict.fromkeys(VARIANTS, 0)
        for client in clients.values():  # warm-up, and the pool as full as a block leaves it
            await asyncio.gather(
                *(bench_loop.agent_flow_run(client, stream) for _ in range(at_once))
            )
        samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for variant in interleaved(VARIANTS, args.rounds):
            client = clients[variant]
            connections = server.connections
            started = time.process_time()
            runs = max(at_once, args.runs) // at_once
            turns = 0
            for _ in range(runs):
                batch = [bench_loop.agent_flow_run(client, stream) for _ in range(at_once)]
                turns += sum(await asyncio.gather(*batch))
            samples[variant].append((time.process_time() - started) * 1000 / turns)
            made[variant] += server.connections - connections
        for client in clients.values():
            await client.aclose()
        for given in ("unsplit", "sdk"):  # given, so not closed by their OpenAIClients
            await clients[given].sdk_client.close()
    cpu = {variant: statistics.median(values) for variant, values in samples.items()}
    return cpu, made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--at-once", default="1,100", help="runs at once, per cell")
    parser.add_argument("--runs", type=int, default=30, help="at least this many runs per block")
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    print(
        f"K={args.k}, {args.rounds} rounds; load {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} cores; CPU ms per model turn (median of rounds)"
    )
    print(
        f"{'runs at once':<14}{'stream':>7}{'ours':>8}{'unsplit':>8}{'sdk':>8}"
        f"{'saved vs unsplit':>18}{'vs sdk':>8}   connections made (ours / unsplit / sdk)"
    )
    for at_once in (int(n) for n in args.at_once.split(",")):
        for stream in (False, True):
            cpu, made = asyncio.run(cell(at_once, stream, args))
            ours, unsplit, sdk = cpu["ours"], cpu["unsplit"], cpu["sdk"]
            print(
                f"{at_once:<14}{stream!s:>7}{ours:>8.3f}{unsplit:>8.3f}{sdk:>8.3f}"
                f"{1 - ours / unsplit:>18.0%}{1 - ours / sdk:>8.0%}   "
                f"{made['ours']} / {made['unsplit']} / {made['sdk']}"
            )


if __name__ == "__main__":
    main()
