"""Which DBOS executors are alive: a lock each live worker holds for as long as it runs.

A worker takes its own lock before DBOS starts and keeps it until its process ends; the
operating system or the database releases it when the process dies, however it dies (SIGKILL
included). Another worker that can take a lock, then, knows its owner is gone, and holds it
while it recovers the owner's runs, so a restarted owner waits for that recovery to finish
before it starts (and finds nothing left to take back).

- PostgreSQL system database: session-level advisory locks on one connection of this worker.
  That connection can drop (a database restart or failover, ``pg_terminate_backend``, a
  proxy's idle cut) and its locks with it: `Liveness.check` (called by the worker's watch on
  every pass) finds a closed or broken connection, connects again and takes its own lock
  again, so the worker is taken for dead only for that gap. A run its worker was wrongly taken
  for dead for is still executed once at a time: the session's claim in the store
  (`agent_flow.durable._workflow._claim`) makes a second execution wait for the first.
- SQLite system database (one machine): ``flock`` on a file per executor beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from agent_flow.durable.config import libpq_url

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["Liveness", "liveness_for"]

_KEY = "agent_flow_executor:"

logger = logging.getLogger("agent_flow.durable")


class Liveness(Protocol):
    """Locks that say which executors are alive."""

    async def hold(self, executor_id: str) -> None:
        """Take this process's own lock (waiting while another worker recovers its runs)."""
        ...

    async def claim_if_dead(self, executor_id: str) -> bool:
        """Take `executor_id`'s lock if its owner is gone; True if taken (then `release`)."""
        ...

    async def release(self, executor_id: str) -> None:
        """Give back a lock `claim_if_dead` took."""
        ...

    async def aclose(self) -> None:
        """Release every lock (the process's own too)."""
        ...

    async def check(self) -> None:
        """Make sure this process still holds its own lock (reconnect and take it again)."""
        ...

    async def query(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]] | None:
        """Rows of a read on the system database over this process's connection.

        None where there is no such connection (a SQLite system database).
        """
        ...


class _PostgresLiveness:
    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: AsyncConnection[tuple[object, ...]] | None = None
        self._own: str | None = None
        #: Times the connection was made again after it dropped (for tests and logs).
        self.reconnects = 0

    async def _connection(self) -> AsyncConnection[tuple[object, ...]]:
        import psycopg  # the postgres extra, needed by a postgresql:// system database

        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            # Dropped: the locks went with it. Connect again and take our own back first.
            self._conn = None
            with contextlib.suppress(Exception):
                await conn.close()
            self.reconnects += 1
            logger.warning("the liveness connection dropped; connecting again")
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
        if self._own is not None:
            await conn.execute(
                "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (_KEY + self._own,)
            )
        self._conn = conn
        return conn

    async def _execute(self, sql: str, executor_id: str, *, fetch: bool = True) -> bool:
        rows = await self._rows(sql, (_KEY + executor_id,), fetch=fetch)
        return bool(rows and rows[0][0])

    async def _rows(
        self, sql: str, params: tuple[object, ...], *, fetch: bool = True
    ) -> list[tuple[object, ...]]:
        import psycopg

        for attempt in (1, 2):
            conn = await self._connection()
            try:
                cursor = await conn.execute(sql, params)
                return await cursor.fetchall() if fetch else []
            except psycopg.OperationalError:
                # The connection dropped (found only when used): close it, so the next
                # attempt connects again and takes our own lock back, then tries once more.
                with contextlib.suppress(Exception):
                    await conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def query(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]] | None:
        return await self._rows(sql, params)

    async def hold(self, executor_id: str) -> None:
        self._own = executor_id
        if self._conn is None:
            await self._connection()  # takes it
            return
        await self._execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", executor_id, fetch=False
        )

    async def check(self) -> None:
        await self._execute("SELECT %s::text IS NOT NULL", "")

    async def claim_if_dead(self, executor_id: str) -> bool:
        return await self._execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", executor_id
        )

    async def release(self, executor_id: str) -> None:
        await self._execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", executor_id)

    async def aclose(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()


class _FileLiveness:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._held: dict[str, IO[bytes]] = {}

    def _open(self, executor_id: str) -> IO[bytes]:
        self._dir.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in executor_id)
        return open(self._dir / f"{safe}.lock", "ab")

    async def hold(self, executor_id: str) -> None:
        handle = self._open(executor_id)
        await asyncio.to_thread(fcntl.flock, handle.fileno(), fcntl.LOCK_EX)
        self._held[executor_id] = handle

    async def claim_if_dead(self, executor_id: str) -> bool:
        handle = self._open(executor_id)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._held[executor_id] = handle
        return True

    async def release(self, executor_id: str) -> None:
        handle = self._held.pop(executor_id, None)
        if handle is not None:
            handle.close()  # closing the file releases its flock

    async def check(self) -> None:
        return None  # a flock lives as long as this process: nothing drops it

    async def query(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]] | None:
        return None

    async def aclose(self) -> None:
        for handle in self._held.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._held.clear()


def liveness_for(system_database_url: str) -> Liveness:
    """The liveness locks that fit a DBOS system database URL."""
    url = libpq_url(system_database_url)
    if url is not None:
        return _PostgresLiveness(url)
    path = system_database_url.removeprefix("sqlite:///")
    return _FileLiveness(Path(os.path.abspath(path + ".executors")))
