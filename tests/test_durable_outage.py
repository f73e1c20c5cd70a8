"""Durable runs through database outages, on a private PostgreSQL (never the machine's).

Two worker processes (`tests/durable_app.py`, each tool call slowed so that runs stay in
flight) share one private cluster (`tests/private_postgres.py`) for DBOS and the sessions.
While runs execute, the cluster is stopped and started again (a restart: every connection
drops, every write fails for seconds), then client connections are terminated at random (a
proxy's idle cut, ``pg_terminate_backend``: the workers' liveness connections among them),
then one worker is SIGKILLed. More runs are enqueued after. It passes only when every run
finishes exactly once: its outcome is the model's answer, one ``run_finished`` is stored,
its events are numbered without gap or repeat, no session is left ``active``, and the
counting tool (not idempotent) ran each call at most once and every completed call once.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="the outage test needs the postgres extra")
pytest.importorskip("dbos", reason="the outage test needs the durable extra")

import psycopg

from agent_flow.durable import DurableClient, DurableConfig
from agent_flow.sessions import open_store
from tests.durable_helpers import Workers, assert_each_ran_once, counts_of, until
from tests.private_postgres import PrivatePostgres

CALLS = 5  # tool calls per run


def _terminate_some(url: str, how_many: int) -> int:
    """Terminate up to `how_many` client connections at random; return how many went."""
    with (
        contextlib.suppress(psycopg.OperationalError),
        psycopg.connect(url, autocommit=True, connect_timeout=5) as conn,
    ):
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
            "ORDER BY random() LIMIT %s",
            (how_many,),
        ).fetchall()
        return sum(1 for (done,) in rows if done)
    return 0


@pytest.mark.timeout(420)
async def test_every_run_finishes_once_through_a_restart_cut_connections_and_a_kill(
    private_cluster: PrivatePostgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_url = private_cluster.create_database("sessions")
    system_url = private_cluster.create_database("dbos")
    monkeypatch.setenv("DURABLE_APP_PAUSE", "0.3")
    durable = DurableConfig(enabled=True, system_database_url=system_url, poll_seconds=0.1)
    group = Workers(store_url, system_url, tmp_path)
    try:
        async with open_store(store_url) as store, DurableClient(durable, store) as client:
            first, second = group.start("worker-a"), group.start("worker-b")

            async def enqueue(n: int) -> list[tuple[str, str]]:
                runs = []
                for _ in range(n):
                    info = await store.create(agent="durable")
                    handle = await client.enqueue(info.id, f"count {CALLS}")
                    runs.append((info.id, handle.run_id))
                return runs

            runs = await enqueue(6)
            # Mid-run: at least three runs made a call.
            await until(lambda: sum(1 for _, run in runs if counts_of(tmp_path, run)) >= 3, 120)
            # 1. The database restarts: down for three seconds.
            private_cluster.stop("fast")
            await asyncio.sleep(3)
            private_cluster.start()
            # 2. Connections cut at random, the liveness ones among them.
            cut = 0
            for _ in range(4):
                await asyncio.sleep(0.5)
                cut += _terminate_some(private_cluster.url(), 4)
            assert cut > 0
            # 3. One worker dies after the outage; its runs go to the other.
            first.kill()
            first.wait()
            runs += await enqueue(3)
            outcomes = {}
            for session_id, run_id in runs:
                handle = client.handle(run_id, session_id)
                outcomes[run_id] = await asyncio.wait_for(handle.outcome(), 300)
            assert second.poll() is None  # the survivor lived through it all
            await assert_each_ran_once(store, tmp_path, runs, outcomes)
    finally:
        group.stop()
