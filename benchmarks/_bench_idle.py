"""Part ``idle`` of bench_scale: what a durable worker costs while nothing is queued.

One `DurableWorker` process (a PostgreSQL session store and system database, fresh per row;
its instant model served from another process, so that the model server's own work is not
counted) waits with an empty queue. It reports its CPU time per second (from /proc) and the
commits per second of the system database (``pg_stat_database.xact_commit``: each of DBOS's
polls, and the worker's looks and watch, is one or more transactions; DBOS checks each pooled
connection with a ``SELECT`` of its own when taken). Two windows: 10 s in DBOS's first minute
(its scheduler looks for schedules every second then; the statistics of DBOS's migrations may
still arrive in it) and 30 s after it. Then runs are enqueued one after another and the time
from enqueue to the worker's stored ``run_started`` is the start latency (the first run,
then the median of the next four). Rows: the default, and ``idle_seconds=1``. Goals (issue
30): <= 5 ms of CPU per second, <= 2 commits per second, a queued run started within 250 ms.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import time
import uuid
from typing import Any

from _bench_runs import config, model_server, tools
from bench_server import _cpu_seconds, _rss_mb

IDLE_SECONDS = 10.0
#: The window after DBOS's first minute: six of the worker's 5 s looks, one of DBOS's 30 s.
STEADY_SECONDS = 30.0
#: DBOS looks for schedules every second for a minute after launch, then every 30 s.
DBOS_STARTUP_SECONDS = 62.0


async def _hundred_runs(store_url: str, system_url: str) -> None:
    """100 runs of two tool steps each, enqueued at once, to their end."""
    from agent_flow.durable import DurableClient, DurableConfig
    from agent_flow.sessions import open_store

    durable = DurableConfig(enabled=True, system_database_url=system_url)
    async with open_store(store_url) as store, DurableClient(durable) as client:
        handles = []
        for _ in range(100):
            info = await store.create(agent="idle")
            handles.append(await client.enqueue(info.id, "go"))
        for handle in handles:
            await handle.outcome(poll_seconds=0.05)


def _idle_worker(
    store_url: str, system_url: str, idle: float | None, base_url: str, ready: Any, stop: Any
) -> None:
    async def main() -> None:
        from agent_flow import OpenAIClient
        from agent_flow.durable import DurableConfig, DurableWorker
        from agent_flow.sessions import open_store

        durable = DurableConfig(enabled=True, system_database_url=system_url, idle_seconds=idle)
        async with open_store(store_url) as store:
            llm = OpenAIClient("m", base_url=base_url, api_key="k")
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


async def _start_latencies(store_url: str, system_url: str, runs: int = 5) -> list[float]:
    """Enqueue-to-``run_started`` of `runs` runs, one after another (ms)."""
    from agent_flow.durable import DurableClient, DurableConfig
    from agent_flow.sessions import open_store

    durable = DurableConfig(enabled=True, system_database_url=system_url)
    latencies = []
    async with open_store(store_url) as store, DurableClient(durable) as client:
        for _ in range(runs):
            info = await store.create(agent="idle")
            enqueued = time.time()
            handle = await client.enqueue(info.id, "go")
            await handle.outcome(poll_seconds=0.02)
            events = await store.events(info.id)
            started = next(e for e in events if e.kind == "run_started")
            latencies.append((started.timestamp.timestamp() - enqueued) * 1000)
    return latencies


def _window(pid: int, admin_url: str, database: str, seconds: float) -> tuple[float, float]:
    """CPU ms per second of `pid` and commits per second of `database` over `seconds`."""
    cpu0, commits0, t0 = sum(_cpu_seconds(pid)), _commits(admin_url, database), time.time()
    time.sleep(seconds)
    cpu1, commits1, t1 = sum(_cpu_seconds(pid)), _commits(admin_url, database), time.time()
    return (cpu1 - cpu0) * 1000 / (t1 - t0), (commits1 - commits0) / (t1 - t0)


def _one(admin_url: str, idle: float | None) -> dict[str, float]:
    import psycopg
    from psycopg import sql

    base = admin_url.rpartition("/")[0]
    database = f"af_idle_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    store_url = f"{admin_url}?schema={database}"
    system_url = f"{base}/{database}"
    context = multiprocessing.get_context("spawn")
    ready, stop, url = context.Event(), context.Event(), context.Queue()
    server = context.Process(target=model_server, args=(2, url, stop))
    server.start()
    base_url = url.get(timeout=60)
    proc = context.Process(
        target=_idle_worker, args=(store_url, system_url, idle, base_url, ready, stop)
    )
    proc.start()
    try:
        assert ready.wait(120), "the worker did not start"
        started = time.time()  # DBOS launched: its first minute runs from here
        time.sleep(2.0)  # settle: DBOS's threads start, the queue is registered
        assert proc.pid is not None
        cpu_first, commits_first = _window(proc.pid, admin_url, database, IDLE_SECONDS)
        time.sleep(max(0.0, DBOS_STARTUP_SECONDS - (time.time() - started)))
        cpu, commits = _window(proc.pid, admin_url, database, STEADY_SECONDS)
        rss_idle = _rss_mb(proc.pid)
        latencies = asyncio.run(_start_latencies(store_url, system_url))
        asyncio.run(_hundred_runs(store_url, system_url))
        rss_after = _rss_mb(proc.pid)
    finally:
        stop.set()
        for process in (proc, server):
            process.join(30)
            if process.is_alive():
                process.kill()
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
        "cpu_first": cpu_first,
        "commits_first": commits_first,
        "cpu_ms_per_s": cpu,
        "commits_per_s": commits,
        "start_first_ms": latencies[0],
        "start_ms": statistics.median(latencies[1:]),
    }


def bench_idle(args: Any) -> None:
    from agent_flow._defaults import DURABLE_IDLE_SECONDS

    print(
        f"one idle durable worker on PostgreSQL, windows of {IDLE_SECONDS:g} s (first minute)"
        f" and {STEADY_SECONDS:g} s (after); load average "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    print(
        f"{'idle_seconds':>12} | {'first minute: CPU ms/s':>22} | {'commits/s':>9} |"
        f" {'after: CPU ms/s':>15} | {'commits/s':>9} | {'run starts in (first, then)':>27}"
        f" | {'RSS idle':>8} | {'after 100 runs':>14}"
    )
    for idle in (None, 1.0):
        r = _one(args.postgres, idle)
        shown = idle if idle is not None else DURABLE_IDLE_SECONDS
        print(
            f"{shown:>12g} | {r['cpu_first']:>22.1f} | {r['commits_first']:>9.1f} |"
            f" {r['cpu_ms_per_s']:>15.1f} | {r['commits_per_s']:>9.1f} |"
            f" {r['start_first_ms']:>13.0f} ms, {r['start_ms']:>5.0f} ms |"
            f" {r['rss_idle_mb']:>5.1f} MB | {r['rss_after_mb']:>11.1f} MB",
            flush=True,
        )
    print("goals: <= 5 ms CPU/s; <= 2 commits/s; a queued run starts within 250 ms")
