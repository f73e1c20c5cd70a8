"""The SQLite store's schema: its versioned migrations (see `sqlite` for the tables).

Migration ``i`` brings a store file from schema version ``i`` to ``i + 1``; the version is kept
in ``PRAGMA user_version``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from agent_flow.sessions._usage import CALLS_QUERY, _assignments, _backfill

__all__ = ["SCHEMA_VERSION", "_MIGRATIONS"]


def _create_v1(conn: sqlite3.Connection) -> None:
    for statement in (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            title TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            metadata TEXT NOT NULL,
            steps INTEGER NOT NULL,
            entry_count INTEGER NOT NULL,
            event_count INTEGER NOT NULL,
            environment_version INTEGER NOT NULL,
            environment TEXT,
            revision TEXT NOT NULL
        )""",
        "CREATE INDEX sessions_by_update ON sessions (updated_at)",
        """CREATE TABLE entries (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            entry_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        """CREATE TABLE environment_changes (
            session_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
        """CREATE TABLE events (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        "CREATE INDEX events_by_run ON events (session_id, run_id, seq)",
    ):
        conn.execute(statement)


def _add_task_v2(conn: sqlite3.Connection) -> None:
    """The task a session was created for (NULL for sessions stored before)."""
    conn.execute("ALTER TABLE sessions ADD COLUMN task TEXT")


def _add_usage_v3(conn: sqlite3.Connection) -> None:
    """Each session's model calls, tokens and cost, summed from the events already stored."""
    for column in (
        "model_calls INTEGER NOT NULL DEFAULT 0",
        "prompt_tokens INTEGER NOT NULL DEFAULT 0",
        "completion_tokens INTEGER NOT NULL DEFAULT 0",
        "cost_usd REAL DEFAULT 0.0",
        "unpriced_calls INTEGER NOT NULL DEFAULT 0",
        "estimated_calls INTEGER NOT NULL DEFAULT 0",
    ):
        conn.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
    rows = conn.execute(CALLS_QUERY).fetchall()
    conn.executemany(f"UPDATE sessions SET {_assignments('?')} WHERE id = ?", _backfill(rows))


def _add_checkpoints_v4(conn: sqlite3.Connection) -> None:
    """Durable runs' checkpoints (`Checkpoint`), written with the steps they belong to."""
    conn.execute(
        """CREATE TABLE checkpoints (
            session_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            name TEXT NOT NULL,
            result TEXT NOT NULL,
            PRIMARY KEY (session_id, run_id, position)
        )"""
    )


def _add_owner_v5(conn: sqlite3.Connection) -> None:
    """Who created each session (`SessionInfo.owner`); NULL for sessions stored before."""
    conn.execute("ALTER TABLE sessions ADD COLUMN owner TEXT")
    # One user's sessions, most recently updated first, without reading anyone else's.
    conn.execute("CREATE INDEX sessions_by_owner ON sessions (owner, updated_at DESC, id)")


def _add_leases_v6(conn: sqlite3.Connection) -> None:
    """Each session's lease (`Lease`) and last event id; each event's id (`event_id`).

    Events stored before keep their positions as ids (a fenced id is at least 2**32, so they
    stay first); ``event_id`` stays nullable, SQLite cannot add the constraint in place, and
    every write sets it.
    """
    for column in (
        "last_event_id INTEGER NOT NULL DEFAULT -1",
        "lease_run TEXT",
        "lease_holder TEXT",
        "lease_fence INTEGER NOT NULL DEFAULT 0",
        "lease_expires TEXT",
    ):
        conn.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
    conn.execute("ALTER TABLE events ADD COLUMN event_id INTEGER")
    conn.execute("UPDATE events SET event_id = position")
    conn.execute(
        "UPDATE sessions SET last_event_id = "
        "COALESCE((SELECT max(event_id) FROM events WHERE session_id = sessions.id), -1)"
    )
    # Reading on after an id walks this index; unique: an id names one event of its session.
    conn.execute("CREATE UNIQUE INDEX events_by_id ON events (session_id, event_id)")


#: Migration ``i`` brings a store file from schema version ``i`` to ``i + 1``. To change the
#: schema, append a migration; never edit one that shipped.
_MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _create_v1,
    _add_task_v2,
    _add_usage_v3,
    _add_checkpoints_v4,
    _add_owner_v5,
    _add_leases_v6,
)

#: The schema version this agent_flow writes (``PRAGMA user_version`` of the store file).
SCHEMA_VERSION = len(_MIGRATIONS)
