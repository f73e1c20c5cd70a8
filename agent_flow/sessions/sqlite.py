"""`SQLiteSessionStore`: sessions in one SQLite file, one transaction per step, no server.

Durability. Every write is one SQLite transaction in WAL mode, so a process killed at any
moment (SIGKILL) loses at most the step in flight; reopening finds every completed step, with
the history and the environment of the same step. ``synchronous=FULL`` (the default) also
syncs the log at each commit, so a completed step survives a power loss too: one fsync per
step is small next to a model call; ``synchronous="normal"`` trades that away for speed.

Concurrency. Each `SQLiteSessionStore` runs its one connection on its own worker thread, off
the event loop. Several stores, in one process or many, may read while one writes (WAL);
writers queue on SQLite's lock for up to ``busy_timeout`` seconds, then fail with
`StoreError`. A store notices when another store wrote a session since it last did (each
write stamps a new revision) and then compares against what is stored, so two writers never
corrupt a session: the last write wins whole. Who may write at all is the session's lease
(`SessionStore.claim`; the rules are `_lease`'s, the SQL `_sqlite_lease`'s): a claim, a
renewal and a fenced write read the lease inside their ``BEGIN IMMEDIATE`` transaction, which
holds the file's write lock, so no claim can slip between that check and the write. The
lease's clock is this machine's.

Storage (schema version `SCHEMA_VERSION`, kept in ``PRAGMA user_version``; opening an older
file migrates it, a newer one raises `StoreError`)::

    sessions(id PK, agent, title, status, created_at, updated_at, metadata JSON, steps,
             entry_count, event_count, environment_version, environment JSON, revision,
             task, model_calls, prompt_tokens, completion_tokens, cost_usd (NULL: unknown),
             unpriced_calls, estimated_calls, owner (NULL: none), last_event_id (-1: none),
             lease_run, lease_holder, lease_fence, lease_expires (lease_run NULL: no lease))
    entries(session_id, position, entry_id, kind, data JSON)          PK (session_id, position)
    environment_changes(session_id, version, data JSON)               PK (session_id, version)
    events(session_id, position, run_id, seq, kind, data JSON, event_id)
                                  PK (session_id, position), UNIQUE (session_id, event_id)
    checkpoints(session_id, run_id, position, name, result)  PK (session_id, run_id, position)
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from agent_flow.errors import StoreError, UserError
from agent_flow.sessions._backend import (
    _INFO_COLUMNS,
    _LEASE_COLUMNS,
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
from agent_flow.sessions._base import _R, _OnWorker, _StoreBase
from agent_flow.sessions._lease import _LeaseState, _new_event_ids, _writable
from agent_flow.sessions._sqlite_lease import (
    _claim,
    _end_dead_run,
    _release,
    _renew,
    _set_lease,
)
from agent_flow.sessions._sqlite_rows import (
    _INSERT_CHANGE,
    _INSERT_ENTRY,
    _info_from_row,
    _insert_checkpoints,
    _insert_events,
    _lease_state,
    _timestamp,
    _transaction,
)
from agent_flow.sessions._sqlite_schema import _MIGRATIONS, SCHEMA_VERSION
from agent_flow.sessions._usage import _assignments, _Totals
from agent_flow.sessions.models import Checkpoint, Lease, SessionInfo
from agent_flow.sessions.protocol import default_store_path

__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]


class _SQLiteBackend:
    """The SQL of the store; every method runs on the store's one worker thread."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["normal", "full"],
        busy_timeout: float,
        trace: Callable[[str], None] | None,
    ) -> None:
        self.path = path
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._trace = trace
        self._conn: sqlite3.Connection | None = None

    def open(self) -> None:
        self._connection()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are begun and ended explicitly (see _transaction).
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            if self._trace is not None:
                conn.set_trace_callback(self._trace)
            self._check_version(conn)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"the session store {str(self.path)!r} cannot use write-ahead logging "
                    f"(journal mode {mode!r}); put it on a local file system"
                )
            conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _check_version(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the session store {str(self.path)!r} has schema version {version}, newer than "
                f"the {SCHEMA_VERSION} this agent_flow knows; upgrade agent_flow or use another "
                "store path"
            )
        return version

    def _migrate(self, conn: sqlite3.Connection) -> None:
        if self._check_version(conn) == SCHEMA_VERSION:
            return
        with _transaction(conn, write=True):
            # Read again under the write lock: another process may have migrated meanwhile.
            version = self._check_version(conn)
            if (
                version == 0
                and conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' LIMIT 1"
                ).fetchone()
            ):
                raise StoreError(
                    f"{str(self.path)!r} is a database that is not an agent_flow session store; "
                    "give the store another path"
                )
            for migration in _MIGRATIONS[version:]:
                migration(conn)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def create(self, info: SessionInfo, revision: str) -> None:
        conn = self._connection()
        with _transaction(conn, write=True):
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (info.id,)).fetchone():
                raise _exists(info.id)
            self._insert_session(conn, info, revision, None)

    @staticmethod
    def _insert_session(
        conn: sqlite3.Connection, info: SessionInfo, revision: str, environment: str | None
    ) -> None:
        values = (*_info_values(info, _timestamp), environment, revision)
        conn.execute(
            f"INSERT INTO sessions ({_INFO_COLUMNS}, environment, revision) "
            f"VALUES ({', '.join(['?'] * len(values))})",
            values,
        )

    def info(self, session_id: str) -> SessionInfo:
        conn = self._connection()
        row = conn.execute(
            f"SELECT {_INFO_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise _not_found(session_id)
        return _info_from_row(row)

    def read(self, session_id: str, with_events: bool) -> _Stored:
        conn = self._connection()
        with _transaction(conn, write=False):
            row = conn.execute(
                f"SELECT {_INFO_COLUMNS}, environment, revision FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                raise _not_found(session_id)
            entries = conn.execute(
                "SELECT data FROM entries WHERE session_id = ? ORDER BY position", (session_id,)
            ).fetchall()
            changes = conn.execute(
                "SELECT data FROM environment_changes WHERE session_id = ? ORDER BY version",
                (session_id,),
            ).fetchall()
            events = (
                conn.execute(
                    "SELECT data FROM events WHERE session_id = ? ORDER BY position",
                    (session_id,),
                ).fetchall()
                if with_events
                else []
            )
        return _Stored(
            info=_info_from_row(row),
            revision=row["revision"],
            entries=tuple(r[0] for r in entries),
            environment=row["environment"],
            changes=tuple(r[0] for r in changes),
            events=tuple(r[0] for r in events),
        )

    def write_step(self, write: _StepWrite) -> SessionInfo:
        conn = self._connection()
        sid = write.session_id
        with _transaction(conn, write=True):
            row = conn.execute(
                f"SELECT {_INFO_COLUMNS}, lease_holder, lease_expires, revision "
                "FROM sessions WHERE id = ?",
                (sid,),
            ).fetchone()
            if row is None:
                raise _not_found(sid)
            now = datetime.now(UTC)
            state = _lease_state(row)
            dead = _writable(sid, state, now, write.fence, write.lease_run)
            if row["revision"] != write.expected_revision:
                raise _StaleError
            info = _info_from_row(row)
            if dead is not None:
                # An expired lease, never released: end it, as a claim would, then write.
                info = _end_dead_run(conn, info, state, now) or info
                _set_lease(conn, sid, _LeaseState(None, None, state.fence, None))
                info = info.model_copy(update={"lease_run": None})
            ids = _new_event_ids(sid, write.events, write.fence, info.last_event_id)
            if write.keep_entries < info.entry_count:
                conn.execute(
                    "DELETE FROM entries WHERE session_id = ? AND position >= ?",
                    (sid, write.keep_entries),
                )
            conn.executemany(
                _INSERT_ENTRY,
                (
                    (sid, write.keep_entries + i, e.entry_id, e.kind, e.data)
                    for i, e in enumerate(write.entries)
                ),
            )
            env = write.environment
            if env is not None:
                if env.reset:
                    conn.execute("DELETE FROM environment_changes WHERE session_id = ?", (sid,))
                elif env.trim_through > 0:
                    conn.execute(
                        "DELETE FROM environment_changes WHERE session_id = ? AND version <= ?",
                        (sid, env.trim_through),
                    )
                conn.executemany(
                    _INSERT_CHANGE,
                    ((sid, version, data) for version, data in env.changes),
                )
            _insert_events(conn, sid, info.event_count, write.events, ids)
            _insert_checkpoints(conn, sid, write.checkpoints)
            after = _stepped(info, write, ids)
            conn.execute(
                "UPDATE sessions SET status = ?, updated_at = ?, steps = ?, entry_count = ?, "
                "event_count = ?, last_event_id = ?, environment_version = ?, "
                f"{_assignments('?')}, "
                "environment = COALESCE(?, environment), revision = ? WHERE id = ?",
                (
                    after.status,
                    _timestamp(after.updated_at),
                    after.steps,
                    after.entry_count,
                    after.event_count,
                    after.last_event_id,
                    after.environment_version,
                    *_Totals.of(after).values(),
                    env.base if env is not None else None,
                    write.revision,
                    sid,
                ),
            )
        return after

    def sessions(self, limit: int, owner: str | None) -> list[SessionInfo]:
        query = f"SELECT {_INFO_COLUMNS} FROM sessions"
        parameters: list[object] = []
        if owner is not None:
            query += " WHERE owner = ?"
            parameters.append(owner)
        query += " ORDER BY updated_at DESC, id LIMIT ?"
        parameters.append(limit)
        rows = self._connection().execute(query, parameters).fetchall()
        return [_info_from_row(row) for row in rows]

    def claim(self, session_id: str, run_id: str, holder: str, ttl: float) -> Lease:
        return _claim(self._connection(), session_id, run_id, holder, ttl)

    def renew(self, lease: Lease, ttl: float) -> Lease:
        return _renew(self._connection(), lease, ttl)

    def release(self, lease: Lease) -> None:
        _release(self._connection(), lease)

    def events(self, session_id: str, query: _EventQuery) -> list[tuple[int, str]]:
        conn = self._connection()
        # Position and id orders agree (ids only grow): each query walks its own index.
        if query.after_id is not None:
            sql = "SELECT event_id, data FROM events WHERE session_id = ? AND event_id > ?"
            parameters: list[object] = [session_id, query.after_id]
            order = "event_id"
        else:
            sql = "SELECT event_id, data FROM events WHERE session_id = ? AND position >= ?"
            parameters = [session_id, query.offset]
            order = "position"
        if query.run_id is not None:
            sql += " AND run_id = ? AND seq > ?"
            parameters += [query.run_id, query.after_seq]
        sql += f" ORDER BY {order} LIMIT ?"
        parameters.append(-1 if query.limit is None else query.limit)
        with _transaction(conn, write=False):
            rows = conn.execute(sql, parameters).fetchall()
            if (
                not rows
                and not conn.execute(
                    "SELECT 1 FROM sessions WHERE id = ?", (session_id,)
                ).fetchone()
            ):
                raise _not_found(session_id)
        return [(row[0], row[1]) for row in rows]

    def write_checkpoints(
        self,
        session_id: str,
        rows: tuple[Checkpoint, ...],
        synced: bool,
        fence: int | None,
        lease_run: str | None,
    ) -> None:
        conn = self._connection()
        # Outside a transaction only: NORMAL in WAL mode commits without syncing the log.
        unsynced = not synced and self._synchronous == "full"
        if unsynced:
            conn.execute("PRAGMA synchronous = NORMAL")
        try:
            with _transaction(conn, write=True):
                row = conn.execute(
                    f"SELECT {_LEASE_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    raise _not_found(session_id)
                # An un-leased write leaves an expired lease be: checkpoints take no event id.
                _writable(session_id, _lease_state(row), datetime.now(UTC), fence, lease_run)
                _insert_checkpoints(conn, session_id, rows)
        finally:
            if unsynced:
                conn.execute("PRAGMA synchronous = FULL")

    def checkpoints(self, session_id: str, run_id: str) -> list[Checkpoint]:
        conn = self._connection()
        with _transaction(conn, write=False):
            if not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
                raise _not_found(session_id)
            rows = conn.execute(
                "SELECT position, name, result FROM checkpoints WHERE session_id = ? AND "
                "run_id = ? ORDER BY position",
                (session_id, run_id),
            ).fetchall()
        return [Checkpoint(run_id, row[0], row[1], row[2]) for row in rows]

    def insert(self, session: _Import) -> None:
        conn = self._connection()
        sid = session.info.id
        with _transaction(conn, write=True):
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
                raise _exists(sid)
            self._insert_session(conn, session.info, session.revision, session.environment)
            conn.executemany(
                _INSERT_ENTRY,
                ((sid, i, e.entry_id, e.kind, e.data) for i, e in enumerate(session.entries)),
            )
            conn.executemany(
                _INSERT_CHANGE,
                ((sid, version, data) for version, data in session.changes),
            )
            ids = _new_event_ids(sid, session.events, None, -1)
            _insert_events(conn, sid, 0, session.events, ids)

    def delete(self, session_id: str) -> None:
        conn = self._connection()
        with _transaction(conn, write=True):
            if conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                raise _not_found(session_id)
            for table in ("entries", "environment_changes", "events", "checkpoints"):
                conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SQLiteSessionStore(_StoreBase):
    """A `SessionStore` in one SQLite file: WAL mode, one transaction per step, no server.

    The file is opened on first use (or on ``async with``), created with its folders if
    missing, and migrated to `SCHEMA_VERSION` if older. All SQL runs on one worker thread
    owned by the store, never on the event loop.

    Args:
        path: The database file; `default_store_path()` if None.
        synchronous: ``"full"`` (default) syncs at every commit, so a completed step survives
            a power loss; ``"normal"`` survives a killed process but not a power loss.
        busy_timeout: Seconds a write waits for another process's write to finish before
            failing with `StoreError`.
        trace: Called (on the worker thread) with every SQL statement run, for debugging.

    Raises:
        StoreError: On first use: the file is not a session store, its schema is newer than
            this agent_flow, or it cannot be opened.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        synchronous: Literal["normal", "full"] = "full",
        busy_timeout: float = 5.0,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        if synchronous not in ("normal", "full"):
            raise UserError(f"synchronous={synchronous!r} is not 'normal' or 'full'")
        if busy_timeout < 0:
            raise UserError(f"busy_timeout={busy_timeout} is negative; pass 0 or more seconds")
        self.path = Path(path).expanduser() if path is not None else default_store_path()
        backend = _SQLiteBackend(
            self.path, synchronous=synchronous, busy_timeout=busy_timeout, trace=trace
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent_flow.sessions")
        super().__init__(_OnWorker(backend, self._in_thread), repr(str(self.path)))

    async def _in_thread(self, fn: Callable[[], _R]) -> _R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._guarded, fn))

    def _guarded(self, fn: Callable[[], _R]) -> _R:
        try:
            return fn()
        except sqlite3.Error as err:
            hint = (
                "another process holds the write lock; retry, or raise busy_timeout"
                if "locked" in str(err) or "busy" in str(err)
                else "check the file, or give the store another path"
            )
            raise StoreError(f"the session store {self._where} failed ({err}); {hint}") from err

    async def aclose(self) -> None:
        """Close the database connection and stop the worker thread."""
        try:
            await super().aclose()
        finally:
            self._executor.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"SQLiteSessionStore({str(self.path)!r})"
