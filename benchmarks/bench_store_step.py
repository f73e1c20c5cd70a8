"""What storing a run costs per step: CPU of a run saved to each store, against it unsaved.

One agent loop, one scripted model in process (no HTTP: what is measured is the loop and the
store), K tool steps per run (the model calls ``add`` K times, then answers). Variants, taking
turns round by round in one process so that machine load hits them alike:

- ``unstored``: the agent with no store (the baseline);
- ``memory``: saved step by step to the in-memory store (the recorder and the store's own
  bookkeeping, no I/O);
- ``sqlite``: to a SQLite file (``synchronous="full"``, the default: every step's transaction
  is on disk before the next step starts);
- ``sqlite-normal``: the same with ``synchronous="normal"`` (no sync per step: what the sync
  itself costs the process, by difference; not a durable configuration);
- ``postgres``: to PostgreSQL (the client's CPU only: the server's work is another process).

Each prints the median CPU milliseconds per step (``time.process_time`` over a block of runs,
divided by the steps) and its difference from ``unstored``: what storing adds per step.
The client's CPU includes every thread of the process (SQLite runs in a worker thread).

Usage: python benchmarks/bench_store_step.py [--runs 20] [--k 10] [--rounds 7]
    [--stores memory,sqlite,postgres] [--postgres postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench_rounds import interleaved

from agent_flow import AgentConfig, AgentExecutor, ContextConfig
from agent_flow.sessions import SessionStore, open_store
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import ToolExecutor, tool


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def model(k: int) -> FunctionLLM:
    def play(request: Any) -> Reply:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done >= k:
            return reply(f"the sum is {done}")
        return reply(tool_calls=[call("add", a=done, b=1)])

    return FunctionLLM(play, model="gpt-4o-mini")


async def one_run(store: SessionStore | None, k: int) -> None:
    tools = ToolExecutor()
    tools.register(add)
    agent = AgentExecutor(
        model(k),
        config=AgentConfig(context=ContextConfig(max_tokens=32_000), max_iterations=k + 5),
        tools=tools,
        store=store,
    )
    outcome = await agent.run("add them up")
    assert outcome.stop_reason.value == "answered", outcome.stop_reason


async def block(store: SessionStore | None, runs: int, k: int) -> float:
    """CPU ms per step of `runs` runs."""
    started = time.process_time()
    for _ in range(runs):
        await one_run(store, k)
    return (time.process_time() - started) * 1000 / (runs * (k + 1))


async def measure(targets: dict[str, str | None], runs: int, k: int, rounds: int) -> None:
    stores: dict[str, SessionStore | None] = {}
    try:
        for name, target in targets.items():
            stores[name] = _store(target) if target is not None else None
            store = stores[name]
            if store is not None:
                await store.__aenter__()
        for store in stores.values():  # warm up: imports, tokenizer, connections
            await block(store, 2, k)
        samples: dict[str, list[float]] = {name: [] for name in stores}
        for name in interleaved(list(stores), rounds):
            samples[name].append(await block(stores[name], runs, k))
    finally:
        for store in stores.values():
            if store is not None:
                await store.aclose()
    base = statistics.median(samples["unstored"])
    print(f"{'variant':<10}{'CPU ms/step':>13}{'added':>9}")
    for name, values in samples.items():
        median = statistics.median(values)
        added = "" if name == "unstored" else f"{median - base:+9.2f}"
        print(f"{name:<10}{median:>13.2f}{added}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--stores", default="memory,sqlite,postgres")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory() as folder:
        all_targets: dict[str, str | None] = {
            "unstored": None,
            "memory": "memory://",
            "sqlite": f"sqlite://{Path(folder) / 'sessions.db'}",
            "sqlite-normal": f"sqlite-normal://{Path(folder) / 'normal.db'}",
            "postgres": f"{args.postgres}?schema={schema}",
        }
        wanted = ["unstored", *args.stores.split(",")]
        targets = {name: all_targets[name] for name in wanted}
        load = Path("/proc/loadavg").read_text().split()[0]
        print(
            f"{args.runs} runs of {args.k + 1} steps per block, {args.rounds} rounds, "
            f"load {load} on {_cores()} cores"
        )
        try:
            asyncio.run(measure(targets, args.runs, args.k, args.rounds))
        finally:
            if "postgres" in targets:
                _drop(args.postgres, schema)


def _store(target: str) -> SessionStore:
    if target.startswith("sqlite-normal://"):
        from agent_flow.sessions.sqlite import SQLiteSessionStore

        return SQLiteSessionStore(target.removeprefix("sqlite-normal://"), synchronous="normal")
    return open_store(target)


def _cores() -> int:
    import os

    return os.cpu_count() or 1


def _drop(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
