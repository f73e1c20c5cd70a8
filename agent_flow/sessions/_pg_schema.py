"""The PostgreSQL store's schema: its versioned migrations (see `postgres` for the tables).

Migration ``i`` brings a database from schema version ``i`` to ``i + 1``; the store runs the
missing ones under `MIGRATION_LOCK`, an advisory lock, so processes starting together migrate
once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from agent_flow.sessions._usage import CALLS_QUERY, _assignments, _backfill

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_VERSION", "_Conn"]

_Conn = psycopg.AsyncConnection[dict[str, Any]]

# Any constant distinct from other applications' advisory locks on the same database.
MIGRATION_LOCK = 0x61676E74_666C6F77 & 0x7FFFFFFFFFFFFFFF


async def _create_v1(conn: _Conn) -> None:
    for statement in (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            title TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL,
            metadata TEXT NOT NULL,
            steps INTEGER NOT NULL,
            entry_count INTEGER NOT NULL,
            event_count INTEGER NOT NULL,
            environment_version INTEGER NOT NULL,
            environment TEXT,
            revision TEXT NOT NULL,
            task TEXT
        )""",
        "CREATE INDEX sessions_by_update ON sessions (updated_at DESC, id)",
        """CREATE TABLE entries (
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            entry_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        """CREATE TABLE environment_changes (
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            version INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
        """CREATE TABLE events (
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        "CREATE INDEX events_by_run ON events (session_id, run_id, seq)",
    ):
        await conn.execute(statement)


async def _add_usage_v2(conn: _Conn) -> None:
    """Each session's model calls, tokens and cost, summed from the events already stored."""
    await conn.execute(
        "ALTER TABLE sessions ADD COLUMN model_calls INTEGER NOT NULL DEFAULT 0, "
        "ADD COLUMN prompt_tokens BIGINT NOT NULL DEFAULT 0, "
        "ADD COLUMN completion_tokens BIGINT NOT NULL DEFAULT 0, "
        "ADD COLUMN cost_usd DOUBLE PRECISION DEFAULT 0.0, "
        "ADD COLUMN unpriced_calls INTEGER NOT NULL DEFAULT 0, "
        "ADD COLUMN estimated_calls INTEGER NOT NULL DEFAULT 0"
    )
    rows = await (await conn.execute(CALLS_QUERY)).fetchall()
    async with conn.cursor() as many:
        await many.executemany(
            f"UPDATE sessions SET {_assignments('%s')} WHERE id = %s",
            _backfill((r["session_id"], r["kind"], r["data"]) for r in rows),
        )


async def _add_checkpoints_v3(conn: _Conn) -> None:
    """Durable runs' checkpoints (`Checkpoint`), written with the steps they belong to."""
    await conn.execute(
        """CREATE TABLE checkpoints (
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            run_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            name TEXT NOT NULL,
            result TEXT NOT NULL,
            PRIMARY KEY (session_id, run_id, position)
        )"""
    )


async def _add_owner_v4(conn: _Conn) -> None:
    """Who created each session (`SessionInfo.owner`); NULL for sessions stored before."""
    await conn.execute("ALTER TABLE sessions ADD COLUMN owner TEXT")
    # One user's sessions, most recently updated first, without reading anyone else's.
    await conn.execute("CREATE INDEX sessions_by_owner ON sessions (owner, updated_at DESC, id)")


#: Migration ``i`` brings a database from schema version ``i`` to ``i + 1``. To change the
#: schema, append a migration; never edit one that shipped.
MIGRATIONS: tuple[Callable[[_Conn], Awaitable[None]], ...] = (
    _create_v1,
    _add_usage_v2,
    _add_checkpoints_v3,
    _add_owner_v4,
)

#: The schema version this agent_flow writes (the row of ``agent_flow_schema``).
SCHEMA_VERSION = len(MIGRATIONS)
