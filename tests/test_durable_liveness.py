"""A worker's liveness survives its connection: dropped, it is made again and the lock re-taken.

Against the machine's PostgreSQL (skipped without one, except under ``CI=true``): the lock's
connection is terminated from outside (``pg_terminate_backend``, what a database restart or a
proxy's idle cut does), and the worker's next check connects again and holds its lock again,
so another worker takes it for dead only in that gap.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("psycopg", reason="the liveness tests need the postgres extra")

import psycopg

from agent_flow.durable._liveness import liveness_for
from tests.store_helpers.postgres import require_postgres


def _terminate(url: str, backend: int) -> None:
    """Terminate the backend `backend` and wait until it is gone (its locks with it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone() == (True,)
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone():
            conn.execute("SELECT pg_sleep(0.01)")


def _backend(liveness: object) -> int:
    return int(liveness._conn.info.backend_pid)  # type: ignore[attr-defined]


async def test_a_dropped_liveness_connection_is_made_again_and_the_lock_retaken() -> None:
    url = require_postgres()
    worker = f"worker-{uuid.uuid4().hex}"
    mine, theirs = liveness_for(url), liveness_for(url)
    try:
        await mine.hold(worker)
        assert not await theirs.claim_if_dead(worker)  # alive
        _terminate(url, _backend(mine))
        # The gap: the lock went with the connection.
        assert await theirs.claim_if_dead(worker)
        await theirs.release(worker)
        # The next check finds the connection gone, connects again and holds the lock again.
        await mine.check()
        assert getattr(mine, "reconnects", 0) == 1
        assert not await theirs.claim_if_dead(worker)
        # And it keeps answering afterwards (the closed connection is never reused).
        for _ in range(3):
            await mine.check()
        assert getattr(mine, "reconnects", 0) == 1
    finally:
        await mine.aclose()
        await theirs.aclose()


async def test_the_watch_never_reuses_a_dropped_connection() -> None:
    url = require_postgres()
    dead = f"worker-{uuid.uuid4().hex}"
    watcher = liveness_for(url)
    try:
        assert await watcher.claim_if_dead(dead)
        await watcher.release(dead)
        _terminate(url, _backend(watcher))
        # The call that meets the dropped connection connects anew and answers.
        for _ in range(3):
            assert await watcher.claim_if_dead(dead)
            await watcher.release(dead)
    finally:
        await watcher.aclose()
