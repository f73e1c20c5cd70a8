"""The PostgreSQL store's leases: claim, renew, release, and ending a dead run, by `_lease`'s rules.

Each runs in one transaction that locks the session's row (``SELECT ... FOR UPDATE``) before
it reads the lease, so two claims, or a claim and a fenced write, never interleave, whichever
processes make them. The clock is the database's (``clock_timestamp()``, read under the lock),
so machines with skewed clocks agree on when a lease expires. `_end_dead_run` runs inside the
caller's transaction (a claim's, or an un-leased step's).

The usual case of each is first tried as one ``UPDATE`` in its own transaction (one round
trip, where the careful way takes five): claiming a session no run holds, renewing or
releasing the lease the session holds. Its ``WHERE`` is that case's condition, evaluated on
the row as locked (a row another transaction changed meanwhile is read again), and its result
is what `_lease`'s rules give for that case. One difference: the clock may be read before the
statement waits for the row's lock (held by a transaction that then changed nothing), so a
lease it sets may expire earlier than the careful way's by that wait, never later. Where it
changes nothing, the careful way runs and answers (a live lease, a dead run to end, a lost
lease, no such session). ``quick=False`` goes the careful way at once (the tests compare the
two).
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
from agent_flow.sessions._pg_rows import _info_from_row, _insert_rows, _lease_state, _utc
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


#: A claim of a session no run holds (`_lease._claimed` with no run: not live, no dead run).
_CLAIM_FREE = (
    "UPDATE sessions SET lease_run = %s, lease_holder = %s, lease_fence = lease_fence + 1, "
    "lease_expires = clock_timestamp() + make_interval(secs => %s::float8) "
    "WHERE id = %s AND lease_run IS NULL RETURNING lease_fence, lease_expires"
)
#: Renewing the lease the session holds (`_lease._renewed`: held, expired or not).
_RENEW_HELD = (
    "UPDATE sessions SET lease_expires = clock_timestamp() + make_interval(secs => %s::float8) "
    "WHERE id = %s AND lease_run = %s AND lease_fence = %s RETURNING lease_expires"
)
#: Releasing the lease the session holds (`_lease._released`: the fence stays).
_RELEASE_HELD = (
    "UPDATE sessions SET lease_run = NULL, lease_holder = NULL, lease_expires = NULL "
    "WHERE id = %s AND lease_run = %s AND lease_fence = %s"
)


async def _claim(
    conn: _Conn,
    session_id: str,
    run_id: str,
    holder: str,
    ttl: float,
    channel: str,
    *,
    quick: bool = True,
) -> Lease:
    row = None
    if quick:
        cur = await conn.execute(_CLAIM_FREE, (run_id, holder, ttl, session_id))
        row = await cur.fetchone()
    if row is not None:
        return Lease(
            session_id=session_id,
            run_id=run_id,
            holder=holder,
            fence=row["lease_fence"],
            expires_at=_utc(row["lease_expires"]),
        )
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


async def _renew(conn: _Conn, lease: Lease, ttl: float, *, quick: bool = True) -> Lease:
    row = None
    if quick:
        cur = await conn.execute(_RENEW_HELD, (ttl, lease.session_id, lease.run_id, lease.fence))
        row = await cur.fetchone()
    if row is not None:
        expires = _utc(row["lease_expires"])
        return lease.model_copy(update={"expires_at": expires, "interrupted_run": None})
    async with conn.transaction():
        row, now = await _locked(conn, lease.session_id, _LEASE_COLUMNS)
        after, renewed = _renewed(lease.session_id, _lease_state(row), now, lease, ttl)
        await _set_lease(conn, lease.session_id, after)
    return renewed


async def _release(conn: _Conn, lease: Lease, *, quick: bool = True) -> None:
    if quick:
        cur = await conn.execute(_RELEASE_HELD, (lease.session_id, lease.run_id, lease.fence))
        if cur.rowcount == 1:
            return
    async with conn.transaction():
        row, _ = await _locked(conn, lease.session_id, _LEASE_COLUMNS)
        after = _released(_lease_state(row), lease)
        if after is not None:
            await _set_lease(conn, lease.session_id, after)
