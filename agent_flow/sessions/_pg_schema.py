"""The PostgreSQL store's schema: its versioned migrations (see `postgres` for the tables).

Migration ``i`` brings a database from schema version ``i`` to ``i + 1``; the store runs the
missing ones (`migrate`) under `MIGRATION_LOCK`, an advisory lock, so processes starting
together migrate once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from agent_flow.errors import StoreError
from agent_flow.sessions._usage import CALLS_QUERY, _assignments, _backfill

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_VERSION", "_Conn", "migrate"]

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


async def _add_leases_v5(conn: _Conn) -> None:
    """Each session's lease (`Lease`) and last event id; each event's id (`event_id`).

    Events stored before keep their positions as ids (a fenced id is at least 2**32, so they
    stay first).
    """
    await conn.execute(
        "ALTER TABLE sessions ADD COLUMN last_event_id BIGINT NOT NULL DEFAULT -1, "
        "ADD COLUMN lease_run TEXT, ADD COLUMN lease_holder TEXT, "
        "ADD COLUMN lease_fence BIGINT NOT NULL DEFAULT 0, ADD COLUMN lease_expires TIMESTAMPTZ"
    )
    await conn.execute("ALTER TABLE events ADD COLUMN event_id BIGINT")
    await conn.execute("UPDATE events SET event_id = position")
    await conn.execute("ALTER TABLE events ALTER COLUMN event_id SET NOT NULL")
    await conn.execute(
        "UPDATE sessions SET last_event_id = e.top FROM "
        "(SELECT session_id, max(event_id) AS top FROM events GROUP BY session_id) AS e "
        "WHERE e.session_id = sessions.id"
    )
    # Reading on after an id walks this index; unique: an id names one event of its session.
    await conn.execute("CREATE UNIQUE INDEX events_by_id ON events (session_id, event_id)")


#: Migration ``i`` brings a database from schema version ``i`` to ``i + 1``. To change the
#: schema, append a migration; never edit one that shipped.
MIGRATIONS: tuple[Callable[[_Conn], Awaitable[None]], ...] = (
    _create_v1,
    _add_usage_v2,
    _add_checkpoints_v3,
    _add_owner_v4,
    _add_leases_v5,
)

#: The schema version this agent_flow writes (the row of ``agent_flow_schema``).
SCHEMA_VERSION = len(MIGRATIONS)


async def _version(conn: _Conn, where: str) -> int:
    """The schema version stored in the connection's schema (0: none yet)."""
    # A scan of pg_class under the statement's snapshot, not to_regclass: the latter reads
    # the catalog cache, which may not yet show a table another process just committed.
    cur = await conn.execute(
        "SELECT bool_or(relname = 'agent_flow_schema') AS has_version, "
        "bool_or(relname = 'sessions') AS has_sessions FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
    )
    row = await cur.fetchone()
    assert row is not None
    if not row["has_version"]:
        if row["has_sessions"]:
            raise StoreError(
                f"the database {where} has a sessions table that is not an agent_flow session "
                "store; give the store another schema"
            )
        return 0
    cur = await conn.execute("SELECT version FROM agent_flow_schema")
    found = await cur.fetchone()
    version = int(found["version"]) if found is not None else 0
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the session store {where} has schema version {version}, newer than the "
            f"{SCHEMA_VERSION} this agent_flow knows; upgrade agent_flow or use another schema"
        )
    return version


async def migrate(
    conn: _Conn,
    *,
    schema: str | None,
    configure: Callable[[_Conn], Awaitable[None]],
    where: str,
) -> None:
    """Create `schema` if missing and bring it to `SCHEMA_VERSION`, under `MIGRATION_LOCK`.

    Args:
        conn: An autocommit connection of its own.
        schema: The PostgreSQL schema of the store; the default ``search_path`` if None.
        configure: Sets the connection up as the store's connections are (time zone, path).
        where: The database and schema, for messages (no password).

    Raises:
        StoreError: The schema holds something else, or a newer schema version.
    """
    # Processes starting together migrate one at a time; the lock is taken before the
    # transaction begins, so that the transaction sees what the previous holder committed.
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        if schema is not None:
            name = sql.Identifier(schema)
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
        await configure(conn)
        async with conn.transaction():
            version = await _version(conn, where)
            if version == SCHEMA_VERSION:
                return
            if version == 0:
                await conn.execute("CREATE TABLE agent_flow_schema (version INTEGER NOT NULL)")
                await conn.execute("INSERT INTO agent_flow_schema VALUES (0)")
            for migration in MIGRATIONS[version:]:
                await migration(conn)
            await conn.execute("UPDATE agent_flow_schema SET version = %s", (SCHEMA_VERSION,))
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
