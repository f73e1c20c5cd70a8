"""The PostgreSQL store's leases: claim, renew, release, and ending a dead run, by `_lease`'s rules.

Each runs in one transaction that locks the session's row (``SELECT ... FOR UPDATE``) before
it reads the lease, so two claims, or a claim and a fenced write, never interleave, whichever
processes make them. The clock is the database's (``clock_timestamp()``, read under the lock),
so machines with skewed clocks agree on when a lease expires. `_end_dead_run` runs inside the
caller's transaction (a claim's, or an un-leased step's).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent_flow.sessions._backend import _INFO_COLUMNS, _LEASE_COLUMNS, _not_found
from agent_flow.sessions._lease import (
    _claimed,
    _interruption,
    _LeaseState,
    _released,
    _renewed,
)
from agent_flow.sessions._pg_rows import _info_from_row, _insert_rows, _lease_state
from agent_flow.sessions._pg_schema import _Conn
from agent_flow.sessions.models import Lease, SessionInfo

__all__ = ["_claim", "_end_dead_run", "_release", "_renew", "_set_lease"]

_SET_LEASE = (
    "UPDATE sessions SET lease_run = %s, lease_holder = %s, lease_fence = %s, "
    "lease_expires = %s WHERE id = %s"
)


async def _set_lease(conn: _Conn, session_id: str, state: _LeaseState) -> None:
    await conn.execute(
        _SET_LEASE, (state.run, state.holder, state.fence, state.expires, session_id)
    )


async def _locked(conn: _Conn, session_id: str, columns: str) -> tuple[dict[str, Any], datetime]:
    """The session's `columns`, its row locked until the transaction ends, and the time now."""
    cur = await conn.execute(
        f"SELECT {columns} FROM sessions WHERE id = %s FOR UPDATE", (session_id,)
    )
    row = await cur.fetchone()
    if row is None:
        raise _not_found(session_id)
    # Read after the lock is held: a claim that waited for it sees its holder's expiry pass.
    cur = await conn.execute("SELECT clock_timestamp() AS now")
    now = await cur.fetchone()
    assert now is not None
    return row, now["now"]


async def _end_dead_run(
    conn: _Conn, info: SessionInfo, dead: _LeaseState, now: datetime
) -> SessionInfo | None:
    """End `dead.run` (its lease expired unreleased); return the info after, None if it had ended.

    Appends its interrupted `RunFinished` and sets the status (`_lease._interruption`); the
    lease columns, and notifying followers, are the caller's.
    """
    assert dead.run is not None
    cur = await conn.execute(
        "SELECT max(seq) AS top, bool_or(kind = 'run_finished') AS finished FROM events "
        "WHERE session_id = %s AND run_id = %s",
        (info.id, dead.run),
    )
    found = await cur.fetchone()
    assert found is not None
    if found["finished"]:
        return None
    row, number, after = _interruption(info, dead.run, dead.fence, found["top"], now)
    await _insert_rows(conn, info.id, events_at=info.event_count, events=(row,), ids=(number,))
    await conn.execute(
        "UPDATE sessions SET status = %s, updated_at = %s, event_count = %s, last_event_id = %s "
        "WHERE id = %s",
        (after.status, after.updated_at, after.event_count, number, info.id),
    )
    return after


async def _claim(
    conn: _Conn, session_id: str, run_id: str, holder: str, ttl: float, channel: str
) -> Lease:
    async with conn.transaction():
        row, now = await _locked(conn, session_id, f"{_INFO_COLUMNS}, lease_holder, lease_expires")
        state = _lease_state(row)
        after, lease, dead = _claimed(session_id, state, now, run_id=run_id, holder=holder, ttl=ttl)
        info = _info_from_row(row)
        if dead is not None and await _end_dead_run(conn, info, state, now) is not None:
            lease = lease.model_copy(update={"interrupted_run": dead})
            # Delivered at commit only: followers elsewhere read the run's end then.
            await conn.execute("SELECT pg_notify(%s, %s)", (channel, session_id))
        await _set_lease(conn, session_id, after)
    return lease


async def _renew(conn: _Conn, lease: Lease, ttl: float) -> Lease:
    async with conn.transaction():
        row, now = await _locked(conn, lease.session_id, _LEASE_COLUMNS)
        after, renewed = _renewed(lease.session_id, _lease_state(row), now, lease, ttl)
        await _set_lease(conn, lease.session_id, after)
    return renewed


async def _release(conn: _Conn, lease: Lease) -> None:
    async with conn.transaction():
        row, _ = await _locked(conn, lease.session_id, _LEASE_COLUMNS)
        after = _released(_lease_state(row), lease)
        if after is not None:
            await _set_lease(conn, lease.session_id, after)
