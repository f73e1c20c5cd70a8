"""`PostgresSessionStore`: sessions in a PostgreSQL database, shared by many processes.

The same contract as `SQLiteSessionStore` (the store core is shared, `_base._StoreBase`): one
transaction per step that appends only what is new, JSON-lines export and import, and a schema
with versioned migrations. Needs the ``postgres`` extra (``pip install 'agent-flow[postgres]'``:
psycopg 3 and psycopg-pool); this module is imported only when a PostgreSQL store is used.

Concurrency. A store holds an async connection pool. A step locks its session's row
(``SELECT ... FOR UPDATE``) and checks the revision the store last wrote: two writers of one
session, in one process or many, never interleave inside a step, and the one that finds the
session changed under it re-plans against what is stored (as with SQLite, the step is applied
whole); a writer that keeps losing that race gets `SessionConflictError`. While a run holds
the session's lease, a step whose session is as this store's last write left it is one guarded
statement instead (`_pg_step`), and the usual claim, renewal and release one ``UPDATE`` each
(`_pg_lease`): the same rows, ids and answers, in one round trip. Nothing is ever half
written: every write is one transaction, and rows reference their session
(``ON DELETE CASCADE``), so a deleted session leaves nothing behind. Who may write at all is
the session's lease (`SessionStore.claim`; the rules are `_lease`'s, the SQL `_pg_lease`'s),
read under that same row lock (``FOR SHARE`` for checkpoints) and timed by the database's
clock.

Storage (schema version `SCHEMA_VERSION`, kept in ``agent_flow_schema``; migrations run under a
advisory lock, so processes starting together migrate once; a newer version
is refused). JSON is kept as ``text``, exactly as written, so environments read back byte for
byte::

    sessions(id PK, agent, title, status, created_at, updated_at, metadata, steps,
             entry_count, event_count, environment_version, environment, revision, task,
             model_calls, prompt_tokens, completion_tokens, cost_usd (NULL: unknown),
             unpriced_calls, estimated_calls, owner (NULL: none), last_event_id (-1: none),
             lease_run, lease_holder, lease_fence, lease_expires (lease_run NULL: no lease))
    entries(session_id FK, position, entry_id, kind, data)         PK (session_id, position)
    environment_changes(session_id FK, version, data)              PK (session_id, version)
    events(session_id FK, position, run_id, seq, kind, data, event_id)
                                   PK (session_id, position), UNIQUE (session_id, event_id)
    checkpoints(session_id FK, run_id, position, name, result)  PK (session_id, run_id, position)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agent_flow._defaults import EVENTS_NOTIFIED_POLL_SECONDS
from agent_flow._utils import readable
from agent_flow.errors import StoreError, UserError
from agent_flow.sessions._backend import (
    _INFO_COLUMNS,
    _LEASE_COLUMNS,
    _checkpoint_taken,
    _EventQuery,
    _exists,
    _Import,
    _info_values,
    _not_found,
    _StaleError,
    _stepped,
    _StepWrite,
    _Stored,
)
from agent_flow.sessions._base import _P, _R, _StoreBase
from agent_flow.sessions._lease import _LeaseState, _new_event_ids, _writable
from agent_flow.sessions._pg_lease import _claim, _end_dead_run, _release, _renew, _set_lease
from agent_flow.sessions._pg_notify import _Listener, channel_for
from agent_flow.sessions._pg_rows import (
    _info_from_row,
    _insert_rows,
    _lease_state,
)
from agent_flow.sessions._pg_schema import SCHEMA_VERSION, _Conn, migrate
from agent_flow.sessions._pg_step import STEP_UPDATE, LastWrites, step_update, write_known
from agent_flow.sessions.models import Checkpoint, Lease, SessionInfo

__all__ = ["SCHEMA_VERSION", "PostgresSessionStore"]


def redact(url: str) -> str:
    """Return `url` with its password, if any, replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    netloc = f"{parts.username}:***@{host}" if parts.username else f":***@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


class _PostgresBackend:
    """The SQL of the store, on a psycopg async connection pool."""

    def __init__(
        self, url: str, *, schema: str | None, max_connections: int, connect_timeout: float
    ) -> None:
        self._url = url
        self._schema = schema
        self._max = max_connections
        self._timeout = connect_timeout
        self._pool: AsyncConnectionPool[_Conn] | None = None
        self._opening = asyncio.Lock()
        self.channel = channel_for(schema)
        #: Each session as this store's last step left it: one statement for the next step.
        self._last = LastWrites()
        #: Whether steps and leases try one statement first (`_pg_step`, `_pg_lease`); the
        #: tests turn it off to compare with the careful way.
        self._one_statement = True

    async def _configure(self, conn: _Conn) -> None:
        await conn.execute("SET TIME ZONE 'UTC'")
        if self._schema is not None:
            await conn.execute(
                sql.SQL("SET search_path TO {}").format(sql.Identifier(self._schema))
            )

    async def open(self) -> None:
        await self._ready()

    async def _ready(self) -> AsyncConnectionPool[_Conn]:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is not None:
                return self._pool
            # Create the schema and migrate on a connection of its own, before the pool
            # opens: a pool connection's search_path must name a schema that exists.
            first = await psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=max(1, round(self._timeout)),
            )
            async with first:
                where = f"{redact(self._url)!r} (schema {self._schema or 'default'})"
                await migrate(first, schema=self._schema, configure=self._configure, where=where)
            pool: AsyncConnectionPool[_Conn] = AsyncConnectionPool(
                self._url,
                min_size=1,
                max_size=self._max,
                open=False,
                configure=self._configure,
                kwargs={"autocommit": True, "row_factory": dict_row},
                connection_class=psycopg.AsyncConnection[dict[str, Any]],
                name="agent_flow.sessions",
                # Waiting for a connection (the database down or restarting) is bounded like
                # the first connection, not by the pool's own 30 s.
                timeout=self._timeout,
                # A pooled connection is checked before it is handed out: one that a database
                # restart or a proxy's idle cut closed is replaced, not used for a write.
                check=_check_pooled,
            )
            try:
                await pool.open(wait=True, timeout=self._timeout)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            return pool

    async def create(self, info: SessionInfo, revision: str) -> None:
        # One statement: its own transaction (the connection is in autocommit).
        async with (await self._ready()).connection() as conn:
            if not await self._insert_session(conn, info, revision, None):
                raise _exists(info.id)
        self._last.wrote(revision, info)

    @staticmethod
    async def _insert_session(
        conn: _Conn, info: SessionInfo, revision: str, environment: str | None
    ) -> bool:
        values = (*_info_values(info, lambda moment: moment), environment, revision)
        cur = await conn.execute(
            f"INSERT INTO sessions ({_INFO_COLUMNS}, environment, revision) "
            f"VALUES ({', '.join(['%s'] * len(values))}) "
            "ON CONFLICT (id) DO NOTHING",
            values,
        )
        return cur.rowcount == 1

    async def info(self, session_id: str) -> SessionInfo:
        async with (await self._ready()).connection() as conn:
            cur = await conn.execute(
                f"SELECT {_INFO_COLUMNS} FROM sessions WHERE id = %s",
                (session_id,),
            )
            row = await cur.fetchone()
        if row is None:
            raise _not_found(session_id)
        return _info_from_row(row)

    async def read(self, session_id: str, with_events: bool) -> _Stored:
        async with (await self._ready()).connection() as conn, conn.transaction():
            # One snapshot for every statement below.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur = await conn.execute(
                f"SELECT {_INFO_COLUMNS}, environment, revision FROM sessions WHERE id = %s",
                (session_id,),
            )
            row = await cur.fetchone()
            if row is None:
                raise _not_found(session_id)
            cur = await conn.execute(
                "SELECT data FROM entries WHERE session_id = %s ORDER BY position", (session_id,)
            )
            entries = await cur.fetchall()
            cur = await conn.execute(
                "SELECT data FROM environment_changes WHERE session_id = %s ORDER BY version",
                (session_id,),
            )
            changes = await cur.fetchall()
            events: list[dict[str, Any]] = []
            if with_events:
                cur = await conn.execute(
                    "SELECT data FROM events WHERE session_id = %s ORDER BY position",
                    (session_id,),
                )
                events = await cur.fetchall()
        return _Stored(
            info=_info_from_row(row),
            revision=row["revision"],
            entries=tuple(r["data"] for r in entries),
            environment=row["environment"],
            changes=tuple(r["data"] for r in changes),
            events=tuple(r["data"] for r in events),
        )

    async def write_step(self, write: _StepWrite) -> SessionInfo:
        try:
            with _checkpoints_free(write.session_id, write.checkpoints):
                after = await self._write_known(write)
                if after is None:  # not as this store last wrote it: the careful way
                    after = await self._write_step(write)
        except BaseException:
            self._last.forget(write.session_id)
            raise
        self._last.wrote(write.revision, after)
        return after

    async def _write_known(self, write: _StepWrite) -> SessionInfo | None:
        """Write the step in one statement if the session is as this store last wrote it."""
        before = self._last.before(write) if self._one_statement else None
        if before is None:
            return None
        async with (await self._ready()).connection() as conn:
            return await write_known(conn, write, before, self.channel)

    async def _write_step(self, write: _StepWrite) -> SessionInfo:
        sid = write.session_id
        async with (await self._ready()).connection() as conn, conn.transaction():
            cur = await conn.execute(
                f"SELECT {_INFO_COLUMNS}, lease_holder, lease_expires, revision, "
                "clock_timestamp() AS now FROM sessions WHERE id = %s FOR UPDATE",
                (sid,),
            )
            row = await cur.fetchone()
            if row is None:
                raise _not_found(sid)
            now, state = row["now"], _lease_state(row)
            dead = _writable(sid, state, now, write.fence, write.lease_run)
            if row["revision"] != write.expected_revision:
                raise _StaleError
            info = _info_from_row(row)
            ended = None
            if dead is not None:
                # An expired lease, never released: end it, as a claim would, then write.
                ended = await _end_dead_run(conn, info, state, now)
                await _set_lease(conn, sid, _LeaseState(None, None, state.fence, None))
                info = (ended or info).model_copy(update={"lease_run": None})
            ids = _new_event_ids(sid, write.events, write.fence, info.last_event_id)
            env = write.environment
            deletes: list[tuple[str, tuple[object, ...]]] = []
            if write.keep_entries < info.entry_count:
                deletes.append(
                    (
                        "DELETE FROM entries WHERE session_id = %s AND position >= %s",
                        (sid, write.keep_entries),
                    )
                )
            if env is not None and env.reset:
                deletes.append(("DELETE FROM environment_changes WHERE session_id = %s", (sid,)))
            elif env is not None and env.trim_through > 0:
                deletes.append(
                    (
                        "DELETE FROM environment_changes WHERE session_id = %s AND version <= %s",
                        (sid, env.trim_through),
                    )
                )
            after = _stepped(info, write, ids)
            # A step that trims nothing is one statement; otherwise the deletes go out with it
            # in one pipeline (one round trip, not one each). A pipeline for one statement
            # costs the client more than it saves.
            writes: contextlib.AbstractAsyncContextManager[object] = (
                conn.pipeline() if deletes else contextlib.nullcontext()
            )
            async with writes:
                for statement, parameters in deletes:
                    await conn.execute(statement, parameters)
                await _insert_rows(
                    conn,
                    sid,
                    entries_at=write.keep_entries,
                    entries=write.entries,
                    changes=env.changes if env is not None else (),
                    events_at=info.event_count,
                    events=write.events,
                    ids=ids,
                    checkpoints=write.checkpoints,
                    # Delivered at commit only: followers elsewhere read what it committed.
                    notify=self.channel if write.events or ended is not None else None,
                    update=(STEP_UPDATE, step_update(after, write)),
                )
        return after

    async def sessions(self, limit: int, owner: str | None) -> list[SessionInfo]:
        query = f"SELECT {_INFO_COLUMNS} FROM sessions"
        parameters: list[object] = []
        if owner is not None:
            query += " WHERE owner = %s"
            parameters.append(owner)
        query += " ORDER BY updated_at DESC, id LIMIT %s"
        parameters.append(limit)
        async with (await self._ready()).connection() as conn:
            cur = await conn.execute(query, parameters)
            rows = await cur.fetchall()
        return [_info_from_row(row) for row in rows]

    async def claim(self, session_id: str, run_id: str, holder: str, ttl: float) -> Lease:
        async with (await self._ready()).connection() as conn:
            lease = await _claim(
                conn, session_id, run_id, holder, ttl, self.channel, quick=self._one_statement
            )
        self._last.claimed(lease)
        return lease

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        async with (await self._ready()).connection() as conn:
            return await _renew(conn, lease, ttl, quick=self._one_statement)

    async def release(self, lease: Lease) -> None:
        async with (await self._ready()).connection() as conn:
            await _release(conn, lease, quick=self._one_statement)

    async def events(self, session_id: str, query: _EventQuery) -> list[tuple[int, str]]:
        # Position and id orders agree (ids only grow): each query walks its own index.
        if query.after_id is not None:
            text = "SELECT event_id, data FROM events WHERE session_id = %s AND event_id > %s"
            parameters: list[object] = [session_id, query.after_id]
            order = "event_id"
        else:
            text = "SELECT event_id, data FROM events WHERE session_id = %s AND position >= %s"
            parameters = [session_id, query.offset]
            order = "position"
        if query.run_id is not None:
            text += " AND run_id = %s AND seq > %s"
            parameters += [query.run_id, query.after_seq]
        text += f" ORDER BY {order} LIMIT %s"
        parameters.append(query.limit)  # LIMIT NULL is no limit
        async with (await self._ready()).connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur = await conn.execute(text, parameters)
            rows = await cur.fetchall()
            if not rows:
                cur = await conn.execute("SELECT 1 FROM sessions WHERE id = %s", (session_id,))
                if await cur.fetchone() is None:
                    raise _not_found(session_id)
        return [(row["event_id"], row["data"]) for row in rows]

    async def write_checkpoints(
        self,
        session_id: str,
        rows: tuple[Checkpoint, ...],
        synced: bool,
        fence: int | None,
        lease_run: str | None,
    ) -> None:
        # One statement (and so one round trip, in its own transaction: the connection is in
        # autocommit), or, unsynced, a transaction whose commit does not wait for the WAL
        # flush: sent as one pipeline. The statement reads the lease with the row locked FOR
        # SHARE (no claim commits meanwhile) and inserts only where `_writable` would let it;
        # when it inserted nothing, the lease it read says why.
        values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows))
        allowed = (
            "lease.lease_run IS NOT NULL AND lease.lease_fence = %s"
            + (" AND lease.lease_run = %s" if lease_run is not None else "")
            if fence is not None
            else "NOT coalesce(lease.lease_run IS NOT NULL AND lease.lease_expires > lease.now, "
            "false)"
        )
        statement = (
            f"WITH lease AS (SELECT {_LEASE_COLUMNS}, clock_timestamp() AS now FROM sessions "
            "WHERE id = %s FOR SHARE), written AS (INSERT INTO checkpoints (session_id, run_id, "
            "position, name, result) SELECT v.* FROM (VALUES "
            f"{values}) AS v (session_id, run_id, position, name, result), lease "
            f"WHERE {allowed} RETURNING 1) "
            "SELECT lease.*, (SELECT count(*) FROM written) AS written FROM lease"
        )
        parameters: list[object] = [session_id]
        parameters += [
            v for c in rows for v in (session_id, c.run_id, c.position, c.name, c.result)
        ]
        if fence is not None:
            parameters.append(fence)
            if lease_run is not None:
                parameters.append(lease_run)
        with _checkpoints_free(session_id, rows):
            async with (await self._ready()).connection() as conn:
                if synced:
                    cur = await conn.execute(statement, parameters)
                else:
                    async with conn.transaction(), conn.pipeline():
                        await conn.execute("SET LOCAL synchronous_commit TO OFF")
                        cur = await conn.execute(statement, parameters)
                found = await cur.fetchone()
        if found is None:
            raise _not_found(session_id)
        if not found["written"]:
            _writable(session_id, _lease_state(found), found["now"], fence, lease_run)
            raise StoreError(
                f"the checkpoints of session {session_id!r} were not written and its lease "
                "allows it; retry"
            )

    async def checkpoints(self, session_id: str, run_id: str) -> list[Checkpoint]:
        async with (await self._ready()).connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur = await conn.execute(
                "SELECT position, name, result FROM checkpoints "
                "WHERE session_id = %s AND run_id = %s ORDER BY position",
                (session_id, run_id),
            )
            rows = await cur.fetchall()
            if not rows:
                cur = await conn.execute("SELECT 1 FROM sessions WHERE id = %s", (session_id,))
                if await cur.fetchone() is None:
                    raise _not_found(session_id)
        return [Checkpoint(run_id, r["position"], r["name"], r["result"]) for r in rows]

    async def insert(self, session: _Import) -> None:
        sid = session.info.id
        async with (await self._ready()).connection() as conn, conn.transaction():
            if not await self._insert_session(
                conn, session.info, session.revision, session.environment
            ):
                raise _exists(sid)
            await _insert_rows(
                conn,
                sid,
                entries=session.entries,
                changes=session.changes,
                events=session.events,
                ids=_new_event_ids(sid, session.events, None, -1),
            )

    async def delete(self, session_id: str) -> None:
        self._last.forget(session_id)
        async with (await self._ready()).connection() as conn:
            cur = await conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))
            if cur.rowcount == 0:
                raise _not_found(session_id)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


async def _check_pooled(conn: _Conn) -> None:
    """The pool's check of a connection before handing it out, with no round trip if it can.

    A connection that a database restart, ``pg_terminate_backend`` or a proxy's idle cut
    ended has something to read (the server's last error, the end of the stream): only then
    is the server asked (`AsyncConnectionPool.check_connection`, an empty query), which
    raises for a dead connection. One with nothing to read is as its last transaction left
    it; asking the server each time cost a round trip per transaction (every step's write).
    A connection cut silently (no end ever arrives) is not found by either check: its next
    statement fails, as it would have failed a moment after a successful check.
    """
    if conn.closed or readable(conn.pgconn.socket):
        await AsyncConnectionPool.check_connection(conn)


@contextlib.contextmanager
def _checkpoints_free(session_id: str, rows: tuple[Checkpoint, ...]) -> Iterator[None]:
    """Turn a duplicate checkpoint (another execution of the run wrote it) into its error."""
    try:
        yield
    except psycopg.errors.UniqueViolation as err:
        if rows and err.diag.table_name == "checkpoints":
            raise _checkpoint_taken(session_id, rows) from err
        raise


class PostgresSessionStore(_StoreBase):
    """A `SessionStore` in a PostgreSQL database, shared by every process that opens it.

    The connection pool is opened on first use (or on ``async with``), and the schema created
    or migrated to `SCHEMA_VERSION`.

    Args:
        url: A libpq URL, ``postgresql://user:password@host:5432/database``.
        schema: The PostgreSQL schema to keep the tables in (created if missing); the
            connection's default ``search_path`` if None.
        max_connections: The size of the connection pool.
        connect_timeout: Seconds to wait for a connection (the first, and each from the pool
            while the database is down or restarting) before failing with `StoreError`.

    Raises:
        UserError: `url` is not a PostgreSQL URL, or a number is out of range.
        StoreError: On first use: the server cannot be reached, the database holds something
            else, or its schema is newer than this agent_flow.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        max_connections: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        if urlsplit(url).scheme not in ("postgresql", "postgres"):
            raise UserError(
                f"{redact(url)!r} is not a PostgreSQL URL; write postgresql://user@host/database"
            )
        if max_connections < 1:
            raise UserError(f"max_connections={max_connections}; pass 1 or more")
        if connect_timeout <= 0:
            raise UserError(f"connect_timeout={connect_timeout}; pass a positive number of seconds")
        self.url = url
        self.schema = schema
        #: The URL without its password, with the schema as ``open_store`` takes it.
        self.location = redact(url) + (
            f"{'&' if '?' in url else '?'}schema={schema}" if schema else ""
        )
        backend = _PostgresBackend(
            url, schema=schema, max_connections=max_connections, connect_timeout=connect_timeout
        )
        where = repr(redact(url) + (f" (schema {schema})" if schema else ""))
        super().__init__(backend, where)
        self._listener = _Listener(url, backend.channel, self._changes, connect_timeout)

    #: Notified of every save (see `_pg_notify`): re-reads are only a safety net.
    _follow_poll = EVENTS_NOTIFIED_POLL_SECONDS

    async def _listen(self) -> None:
        await self._listener.start()

    async def aclose(self) -> None:
        """Release the store; later calls raise `StoreError`. Closing twice is harmless."""
        try:
            await self._listener.aclose()
        finally:  # (cancelled meanwhile: the pool still closes)
            await super().aclose()

    async def _run(
        self, fn: Callable[_P, Awaitable[_R]], *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        try:
            return await super()._run(fn, *args, **kwargs)
        except psycopg.OperationalError as err:
            raise StoreError(
                f"the session store {self._where} cannot be reached or failed ({err}); check "
                "the URL and that the PostgreSQL server runs"
            ) from err
        except psycopg.Error as err:
            raise StoreError(
                f"the session store {self._where} failed ({err}); check the server's log"
            ) from err

    def __repr__(self) -> str:
        return f"PostgresSessionStore({redact(self.url)!r}, schema={self.schema!r})"
