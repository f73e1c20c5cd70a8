"""The SQLite store's leases: claim, renew, release, and ending a dead run, by `_lease`'s rules.

Each runs in one ``BEGIN IMMEDIATE`` transaction (a write's, which holds the file's write lock,
so nobody writes between the read of the lease and its update); the clock is this machine's.
`_end_dead_run` runs inside the caller's transaction (a claim's, or an un-leased step's).
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from agent_flow.sessions._backend import _INFO_COLUMNS, _LEASE_COLUMNS, _not_found
from agent_flow.sessions._lease import (
    _claimed,
    _interruption,
    _LeaseState,
    _released,
    _renewed,
)
from agent_flow.sessions._sqlite_rows import (
    _info_from_row,
    _insert_events,
    _lease_state,
    _timestamp,
    _transaction,
)
from agent_flow.sessions.models import Lease, SessionInfo

__all__ = ["_claim", "_end_dead_run", "_release", "_renew", "_set_lease"]

_SET_LEASE = (
    "UPDATE sessions SET lease_run = ?, lease_holder = ?, lease_fence = ?, lease_expires = ? "
    "WHERE id = ?"
)


def _set_lease(conn: sqlite3.Connection, session_id: str, state: _LeaseState) -> None:
    expires = _timestamp(state.expires) if state.expires is not None else None
    conn.execute(_SET_LEASE, (state.run, state.holder, state.fence, expires, session_id))


def _locked(conn: sqlite3.Connection, session_id: str) -> sqlite3.Row:
    """The session's row (info and lease); call inside a write transaction."""
    row: sqlite3.Row | None = conn.execute(
        f"SELECT {_INFO_COLUMNS}, lease_holder, lease_expires FROM sessions WHERE id = ?",
        (session_id,),
    ).fetchone()
    if row is None:
        raise _not_found(session_id)
    return row


def _end_dead_run(
    conn: sqlite3.Connection, info: SessionInfo, dead: _LeaseState, now: datetime
) -> SessionInfo | None:
    """End `dead.run` (its lease expired unreleased); return the info after, None if it had ended.

    Appends its interrupted `RunFinished` and sets the status (`_lease._interruption`); the
    lease columns are the caller's to set.
    """
    assert dead.run is not None
    top, finished = conn.execute(
        "SELECT max(seq), max(kind = 'run_finished') FROM events "
        "WHERE session_id = ? AND run_id = ?",
        (info.id, dead.run),
    ).fetchone()
    if finished:
        return None
    row, number, after = _interruption(info, dead.run, dead.fence, top, now)
    _insert_events(conn, info.id, info.event_count, (row,), (number,))
    conn.execute(
        "UPDATE sessions SET status = ?, updated_at = ?, event_count = ?, last_event_id = ? "
        "WHERE id = ?",
        (after.status, _timestamp(after.updated_at), after.event_count, number, info.id),
    )
    return after


def _claim(
    conn: sqlite3.Connection, session_id: str, run_id: str, holder: str, ttl: float
) -> Lease:
    with _transaction(conn, write=True):
        row = _locked(conn, session_id)
        now = datetime.now(UTC)
        state = _lease_state(row)
        after, lease, dead = _claimed(session_id, state, now, run_id=run_id, holder=holder, ttl=ttl)
        if dead is not None and _end_dead_run(conn, _info_from_row(row), state, now) is not None:
            lease = lease.model_copy(update={"interrupted_run": dead})
        _set_lease(conn, session_id, after)
    return lease


def _renew(conn: sqlite3.Connection, lease: Lease, ttl: float) -> Lease:
    with _transaction(conn, write=True):
        row = _locked(conn, lease.session_id)
        after, renewed = _renewed(
            lease.session_id, _lease_state(row), datetime.now(UTC), lease, ttl
        )
        _set_lease(conn, lease.session_id, after)
    return renewed


def _release(conn: sqlite3.Connection, lease: Lease) -> None:
    with _transaction(conn, write=True):
        row = conn.execute(
            f"SELECT {_LEASE_COLUMNS} FROM sessions WHERE id = ?", (lease.session_id,)
        ).fetchone()
        if row is None:
            raise _not_found(lease.session_id)
        after = _released(_lease_state(row), lease)
        if after is not None:
            _set_lease(conn, lease.session_id, after)
