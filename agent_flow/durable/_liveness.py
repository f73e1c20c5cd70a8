"""Which DBOS executors are alive: a lock each live worker holds for as long as it runs.

A worker takes its own lock before DBOS starts and keeps it until its process ends; the
operating system or the database releases it when the process dies, however it dies (SIGKILL
included). Another worker that can take a lock, then, knows its owner is gone, and holds it
while it recovers the owner's runs, so a restarted owner waits for that recovery to finish
before it starts (and finds nothing left to take back).

- PostgreSQL system database: session-level advisory locks on one connection of this worker.
- SQLite system database (one machine): ``flock`` on a file per executor beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["Liveness", "liveness_for"]

_KEY = "agent_flow_executor:"


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


class _PostgresLiveness:
    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: AsyncConnection[tuple[object, ...]] | None = None

    async def _connection(self) -> AsyncConnection[tuple[object, ...]]:
        import psycopg  # the postgres extra, needed by a postgresql:// system database

        if self._conn is None:
            self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
        return self._conn

    async def hold(self, executor_id: str) -> None:
        conn = await self._connection()
        await conn.execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (_KEY + executor_id,)
        )

    async def claim_if_dead(self, executor_id: str) -> bool:
        conn = await self._connection()
        cursor = await conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (_KEY + executor_id,)
        )
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def release(self, executor_id: str) -> None:
        conn = await self._connection()
        await conn.execute(
            "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (_KEY + executor_id,)
        )

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

    async def aclose(self) -> None:
        for handle in self._held.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._held.clear()


def liveness_for(system_database_url: str) -> Liveness:
    """The liveness locks that fit a DBOS system database URL."""
    if system_database_url.startswith(("postgresql", "postgres")):
        scheme, _, rest = system_database_url.partition("://")
        return _PostgresLiveness(f"postgresql://{rest}" if "+" in scheme else system_database_url)
    path = system_database_url.removeprefix("sqlite:///")
    return _FileLiveness(Path(os.path.abspath(path + ".executors")))
