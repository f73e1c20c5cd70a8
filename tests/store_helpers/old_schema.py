"""A store at the schema version before the current one, built by hand, with one session in it.

`make_previous_version` runs every migration but the last on a `Backing`'s data (SQLite: the
file; PostgreSQL: its schema), records that version as the stored one, and inserts a session
row as that version's agent_flow wrote it; `stored_version` reads the version back. What a
store of the current agent_flow does with it (migrate on open) is the test's business.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from agent_flow.sessions import _pg_schema, _sqlite_schema
from tests.store_helpers.backing import Backing
from tests.store_helpers.postgres import URL

#: The columns every schema version since the first has, and the row the old session gets.
_COLUMNS = (
    "id, agent, title, status, created_at, updated_at, metadata, steps, entry_count, "
    "event_count, environment_version, environment, revision, task"
)
_CREATED = "2025-06-01T12:00:00.000000+00:00"


def _row(session_id: str) -> tuple[object, ...]:
    return (
        session_id,
        "agent",
        "from before owners",
        "completed",
        _CREATED,
        _CREATED,
        "{}",
        0,
        0,
        0,
        0,
        None,
        "r-old",
        "an old task",
    )


def _sqlite_path(backing: Backing) -> Path:
    return Path(backing.target.removeprefix("sqlite://"))


async def make_previous_version(backing: Backing, session_id: str) -> int:
    """Build `backing`'s store at the previous schema version holding `session_id`; return it."""
    if backing.kind == "sqlite":
        version = len(_sqlite_schema._MIGRATIONS) - 1
        with contextlib.closing(sqlite3.connect(_sqlite_path(backing))) as raw, raw:
            for migration in _sqlite_schema._MIGRATIONS[:version]:
                migration(raw)
            raw.execute(
                f"INSERT INTO sessions ({_COLUMNS}) VALUES ({', '.join('?' * 14)})",
                _row(session_id),
            )
            raw.execute(f"PRAGMA user_version = {version}")
        return version
    assert backing.kind == "postgres", backing.kind
    version = len(_pg_schema.MIGRATIONS) - 1
    async with await psycopg.AsyncConnection.connect(URL, row_factory=dict_row) as conn:
        schema = sql.Identifier(backing.schema)
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        await conn.execute(sql.SQL("SET search_path TO {}").format(schema))
        await conn.execute("CREATE TABLE agent_flow_schema (version INTEGER NOT NULL)")
        await conn.execute("INSERT INTO agent_flow_schema VALUES (%s)", (version,))
        for pg_migration in _pg_schema.MIGRATIONS[:version]:
            await pg_migration(conn)
        await conn.execute(
            f"INSERT INTO sessions ({_COLUMNS}) VALUES ({', '.join(['%s'] * 14)})",
            _row(session_id),
        )
        await conn.commit()
    return version


async def stored_version(backing: Backing) -> int:
    """The schema version `backing`'s data records now."""
    if backing.kind == "sqlite":
        with contextlib.closing(sqlite3.connect(_sqlite_path(backing))) as raw:
            return int(raw.execute("PRAGMA user_version").fetchone()[0])
    async with await psycopg.AsyncConnection.connect(URL) as conn:
        query = sql.SQL("SELECT version FROM {}.agent_flow_schema").format(
            sql.Identifier(backing.schema)
        )
        row = await (await conn.execute(query)).fetchone()
        assert row is not None
        return int(row[0])
