"""The SQLite store's row helpers: transactions, timestamps as text, and the statements it reuses.

Shared by the backend (`sqlite._SQLiteBackend`) and its lease operations (`_sqlite_lease`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from agent_flow.sessions._backend import _checkpoint_taken, _EventRow, _info_of
from agent_flow.sessions._lease import _LeaseState
from agent_flow.sessions.models import Checkpoint, SessionInfo

__all__ = [
    "_INSERT_CHANGE",
    "_INSERT_ENTRY",
    "_INSERT_EVENT",
    "_info_from_row",
    "_insert_checkpoints",
    "_insert_events",
    "_lease_state",
    "_timestamp",
    "_transaction",
]


def _timestamp(moment: datetime) -> str:
    """A fixed-width UTC ISO text, so that stored timestamps sort as text."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


#: The rows a step or an import appends.
_INSERT_ENTRY = (
    "INSERT INTO entries (session_id, position, entry_id, kind, data) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_CHANGE = "INSERT INTO environment_changes (session_id, version, data) VALUES (?, ?, ?)"
_INSERT_EVENT = (
    "INSERT INTO events (session_id, position, event_id, run_id, seq, kind, data) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_CHECKPOINT = (
    "INSERT INTO checkpoints (session_id, run_id, position, name, result) VALUES (?, ?, ?, ?, ?)"
)


def _info_from_row(row: sqlite3.Row) -> SessionInfo:
    return _info_of(row, datetime.fromisoformat)


def _lease_state(row: sqlite3.Row) -> _LeaseState:
    """The lease of a row read with `_backend._LEASE_COLUMNS`."""
    expires = row["lease_expires"]
    return _LeaseState(
        row["lease_run"],
        row["lease_holder"],
        row["lease_fence"],
        datetime.fromisoformat(expires) if expires is not None else None,
    )


def _insert_events(
    conn: sqlite3.Connection,
    session_id: str,
    first_position: int,
    events: Sequence[_EventRow],
    ids: Sequence[int],
) -> None:
    """Append `events` with the ids `ids`, at positions from `first_position` on."""
    conn.executemany(
        _INSERT_EVENT,
        (
            (session_id, first_position + i, number, e.run_id, e.seq, e.kind, e.data)
            for i, (e, number) in enumerate(zip(events, ids, strict=True))
        ),
    )


def _insert_checkpoints(
    conn: sqlite3.Connection, session_id: str, rows: tuple[Checkpoint, ...]
) -> None:
    try:
        conn.executemany(
            _INSERT_CHECKPOINT,
            ((session_id, c.run_id, c.position, c.name, c.result) for c in rows),
        )
    except sqlite3.IntegrityError as err:
        raise _checkpoint_taken(session_id, rows) from err


@contextmanager
def _transaction(conn: sqlite3.Connection, *, write: bool) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front (waiting up to the busy timeout) rather than
    # failing when a read transaction later tries to write; a plain BEGIN reads one snapshot.
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
