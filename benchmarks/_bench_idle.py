"""Part ``idle`` of bench_scale: what a durable worker costs while nothing is queued.

One `DurableWorker` process (its own instant model, a PostgreSQL session store and system
database, fresh per row) waits with an empty queue. Over ``IDLE_SECONDS`` it reports its CPU
time per second (from /proc) and the commits per second of the system database
(``pg_stat_database.xact_commit``: each of DBOS's polls, and the liveness watch, is one or
more transactions). Then one run is enqueued and the time until its worker stored its
``run_started`` is the start latency. Rows: the default ``poll_seconds`` and the 0.05 s the
throughput part uses. Goals (issue 25 and 30): idle writes as low as DBOS allows, <= 5 ms of
CPU per second, a queued run started within 250 ms.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
import uuid
from typing import Any

from _bench_runs import config, model, tools
from bench_server import _cpu_seconds, _rss_mb

from tests.openai_server import OpenAIServer

IDLE_SECONDS = 10.0


async def _hundred_runs(store_url: str, system_url: str, poll: float) -> None:
    """100 runs of two tool steps each, enqueued at once, to their end."""
    from agent_flow.durable import DurableClient, DurableConfig
    from agent_flow.sessions import open_store

    durable = DurableConfig(enabled=True, system_database_url=system_url, poll_seconds=poll)
    async with open_store(store_url) as store, DurableClient(durable) as client:
        handles = []
        for _ in range(100):
            info = await store.create(agent="idle")
            handles.append(await client.enqueue(info.id, "go"))
        for handle in handles:
            await handle.outcome(poll_seconds=0.05)


def _idle_worker(store_url: str, system_url: str, poll: float, ready: Any, stop: Any) -> None:
    async def main() -> None:
        from agent_flow import OpenAIClient
        from agent_flow.durable import DurableConfig, DurableWorker
        from agent_flow.sessions import open_store

        durable = DurableConfig(enabled=True, system_database_url=system_url, poll_seconds=poll)
        async with OpenAIServer(handler=model(2)) as server, open_store(store_url) as store:
            server.record = False
            llm = OpenAIClient("m", base_url=server.base_url, api_key="k")
            async with DurableWorker(
                durable,
                store,
                config(),
                llm_factory=lambda _config: (llm, None),
                tools_factory=lambda _config: tools(),
            ):
                ready.set()
                await asyncio.to_thread(stop.wait)
            await llm.aclose()

    asyncio.run(main())


def _commits(admin_url: str, database: str) -> int:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    return int(row[0]) if row else 0


async def _start_latency(store_url: str, system_url: str, poll: float) -> float:
    from agent_flow.durable import DurableClient, DurableConfig
    from agent_flow.sessions import open_store

    durable = DurableConfig(enabled=True, system_database_url=system_url, poll_seconds=poll)
    async with open_store(store_url) as store, DurableClient(durable) as client:
        info = await store.create(agent="idle")
        enqueued = time.time()
        handle = await client.enqueue(info.id, "go")
        await handle.outcome(poll_seconds=0.02)
        events = await store.events(info.id)
        started = next(e for e in events if e.kind == "run_started")
        return (started.timestamp.timestamp() - enqueued) * 1000


def _one(admin_url: str, poll: float) -> dict[str, float]:
    import psycopg
    from psycopg import sql

    base = admin_url.rpartition("/")[0]
    database = f"af_idle_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    store_url = f"{admin_url}?schema={database}"
    system_url = f"{base}/{database}"
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    proc = context.Process(target=_idle_worker, args=(store_url, system_url, poll, ready, stop))
    proc.start()
    try:
        assert ready.wait(120), "the worker did not start"
        time.sleep(2.0)  # settle: DBOS's threads start, the queue is registered
        assert proc.pid is not None
        cpu0, commits0, t0 = sum(_cpu_seconds(proc.pid)), _commits(admin_url, database), time.time()
        time.sleep(IDLE_SECONDS)
        cpu1, commits1, t1 = sum(_cpu_seconds(proc.pid)), _commits(admin_url, database), time.time()
        latency = asyncio.run(_start_latency(store_url, system_url, poll))
        rss_idle = _rss_mb(proc.pid)
        asyncio.run(_hundred_runs(store_url, system_url, poll))
        rss_after = _rss_mb(proc.pid)
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(database))
            )
    return {
        "rss_idle_mb": rss_idle,
        "rss_after_mb": rss_after,
        "cpu_ms_per_s": (cpu1 - cpu0) * 1000 / (t1 - t0),
        "commits_per_s": (commits1 - commits0) / (t1 - t0),
        "start_ms": latency,
    }


def bench_idle(args: Any) -> None:
    from agent_flow._defaults import DURABLE_POLL_SECONDS

    print(
        f"one idle durable worker on PostgreSQL, {IDLE_SECONDS:g} s; load average "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    print(
        f"{'poll_seconds':>13} | {'CPU ms/s':>8} | {'commits/s':>9} | {'queued run starts in':>20}"
        f" | {'RSS idle':>8} | {'after 100 runs':>14}"
    )
    for poll in (DURABLE_POLL_SECONDS, 0.05):
        result = _one(args.postgres, poll)
        print(
            f"{poll:>13g} | {result['cpu_ms_per_s']:>8.1f} | {result['commits_per_s']:>9.1f} |"
            f" {result['start_ms']:>17.0f} ms | {result['rss_idle_mb']:>5.1f} MB |"
            f" {result['rss_after_mb']:>11.1f} MB",
            flush=True,
        )
    print("goals: <= 5 ms CPU/s; commits as few as DBOS allows (issue: <= 2/s); start <= 250 ms")
