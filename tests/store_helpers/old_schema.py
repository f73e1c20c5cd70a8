"""A store at an earlier schema version, built by hand, with one session in it.

`make_previous_version` runs every migration but the last `back` ones on a `Backing`'s data
(SQLite: the file; PostgreSQL: its schema), records that version as the stored one, and
inserts a session row (and, if asked, its events) as that version's agent_flow wrote them;
`stored_version` reads the version back. What a store of the current agent_flow does with it
(migrate on open) is the test's business.
"""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from agent_flow.events import TextDelta, event_to_json
from agent_flow.sessions import _pg_schema, _sqlite_schema
from tests.store_helpers.backing import Backing
from tests.store_helpers.postgres import URL

#: The columns every schema version since the first has, and the row the old session gets.
_COLUMNS = (
    "id, agent, title, status, created_at, updated_at, metadata, steps, entry_count, "
    "event_count, environment_version, environment, revision, task"
)
_CREATED = "2025-06-01T12:00:00.000000+00:00"


#: The events table's columns in every schema version since the first.
_EVENT_COLUMNS = "session_id, position, run_id, seq, kind, data"


def old_events(count: int) -> list[TextDelta]:
    """The events `make_previous_version` stores (run ``old-run``, seq 0 on)."""
    at = datetime.fromisoformat(_CREATED)
    return [
        TextDelta(run_id="old-run", seq=seq, timestamp=at, text=f"old {seq}")
        for seq in range(count)
    ]


def _event_rows(session_id: str, count: int) -> list[tuple[object, ...]]:
    return [
        (session_id, position, e.run_id, e.seq, e.kind, event_to_json(e))
        for position, e in enumerate(old_events(count))
    ]


def _row(session_id: str, events: int) -> tuple[object, ...]:
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
        events,
        0,
        None,
        "r-old",
        "an old task",
    )


def _sqlite_path(backing: Backing) -> Path:
    return Path(backing.target.removeprefix("sqlite://"))


async def make_previous_version(
    backing: Backing, session_id: str, *, back: int = 1, events: int = 0
) -> int:
    """Build `backing`'s store `back` schema versions ago, holding `session_id`; return it.

    The session has `events` events (`old_events`), stored at positions 0, 1, ...
    """
    if backing.kind == "sqlite":
        version = len(_sqlite_schema._MIGRATIONS) - back
        with contextlib.closing(sqlite3.connect(_sqlite_path(backing))) as raw, raw:
            for migration in _sqlite_schema._MIGRATIONS[:version]:
                migration(raw)
            raw.execute(
                f"INSERT INTO sessions ({_COLUMNS}) VALUES ({', '.join('?' * 14)})",
                _row(session_id, events),
            )
            raw.executemany(
                f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                _event_rows(session_id, events),
            )
            raw.execute(f"PRAGMA user_version = {version}")
        return version
    assert backing.kind == "postgres", backing.kind
    version = len(_pg_schema.MIGRATIONS) - back
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
            _row(session_id, events),
        )
        async with conn.cursor() as many:
            await many.executemany(
                f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s)",
                _event_rows(session_id, events),
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
