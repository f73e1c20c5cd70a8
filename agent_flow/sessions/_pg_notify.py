"""How a PostgreSQL store hears of the steps other processes save: LISTEN/NOTIFY.

Every step save that appends events sends ``pg_notify(channel, session id)`` inside its own
transaction (`_PostgresBackend.write_step`); PostgreSQL delivers it when, and only if, that
transaction commits. A store whose session is being followed (`wait_for_events`,
`follow_events`) holds one extra connection that LISTENs on the channel and wakes the
session's followers, who then read the new events from the tables: the notification only says
"read again", the rows stay the one truth, so a lost, late or duplicated notification can
delay a follower but never make it miss, repeat or reorder an event.

The channel is per store schema (two deployments in one database do not wake each other). If
the LISTEN connection is lost, it reconnects, and every follower re-reads (what was saved
meanwhile is read then); followers also re-read every `EVENTS_NOTIFIED_POLL_SECONDS`.

Why not DBOS streams: events belong to a session, and a session is written by plain runs
(`agent-flow serve`, a script) as well as durable ones; a DBOS stream belongs to one workflow,
so a follower would need to learn which runs to read and when each starts, and the stream would
be a second copy of the events, ordered on its own, beside the store's. The store's own
database and its own transactions give exactly-once, gap-free order without any of that, and
need neither DBOS nor the durable extra.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

import psycopg
from psycopg import sql

from agent_flow._defaults import EVENTS_RECONNECT_SECONDS
from agent_flow._utils import cancel_and_wait
from agent_flow.sessions._changes import _Changes

__all__ = ["_Listener", "channel_for"]

logger = logging.getLogger("agent_flow.sessions")


def channel_for(schema: str | None) -> str:
    """The NOTIFY channel of the store in `schema` (an identifier shorter than 63 bytes)."""
    digest = hashlib.sha256((schema or "").encode()).hexdigest()[:16]
    return f"agent_flow_events_{digest}"


class _Listener:
    """One LISTEN connection of a store, signalling `changes` with each notified session."""

    def __init__(self, url: str, channel: str, changes: _Changes, connect_timeout: float) -> None:
        self._url = url
        self._channel = channel
        self._changes = changes
        self._timeout = max(1, round(connect_timeout))
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=self._timeout
        )
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        except BaseException:  # failed or cancelled: the connection is nobody's but ours
            await conn.close()
            raise
        return conn

    async def start(self) -> None:
        """LISTEN, once; return when listening (so that no later commit goes unheard).

        When the server cannot be reached, followers poll instead, and it is tried again
        at the next call.
        """
        if self._task is not None:
            return
        async with self._starting:
            if self._task is not None:
                return
            try:
                conn = await self._connect()
            except psycopg.Error as err:
                logger.warning("cannot LISTEN for session events (%s); followers poll", err)
                return
            self._task = asyncio.create_task(self._pump(conn), name="agent_flow.sessions.listen")

    async def _pump(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        while True:
            try:
                async with conn:
                    async for notify in conn.notifies():
                        self._changes.signal(notify.payload)
            except psycopg.Error as err:
                logger.warning("the LISTEN connection for session events failed: %s", err)
            # Lost: reconnect, then let every follower read what was saved meanwhile.
            while True:
                await asyncio.sleep(EVENTS_RECONNECT_SECONDS)
                try:
                    conn = await self._connect()
                    break
                except psycopg.Error:
                    continue
            self._changes.signal_all()

    async def aclose(self) -> None:
        """Stop listening and close the connection."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
