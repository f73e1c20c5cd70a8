"""Who may write a session, decided once for every backend: leases, fences and event ids.

A backend reads a session's lease columns (`_LeaseState`) and the clock inside the transaction
of a claim, a renewal, a release or a write, and asks this module what to do; it then writes
what the answer says in that same transaction. So the rules live here, the SQL in the backends:

- `_claimed`: a live lease (set, and expiring after now) refuses the claim with
  `SessionBusyError`; otherwise the claim takes the next fencing number. A lease still set but
  expired was never released: its holder died. Unless the claiming run is that same run (a
  durable run recovered elsewhere goes on), the backend then ends the dead run
  (`_interruption`): a `RunFinished` with stop reason ``interrupted``, numbered after the run's
  last stored event and identified under the dead lease's fence, and the status
  ``interrupted``;
- `_renewed` / `_released`: only the lease the session holds now (same fence and run), even
  expired as long as nobody claimed since; a stale renewal raises `LeaseLostError`, a stale
  release does nothing;
- `_writable`: a write with a fence needs that fence to be the session's and the lease set
  (`LeaseLostError` otherwise); a write without one is refused while a live lease is held
  (`SessionBusyError`), and ends an expired one first, as a claim would (else the dead lease's
  holder, renewing later, could write ids the un-leased write already took);
- `_new_event_ids`: ids of fenced events come from `event_id`, those of un-leased events follow
  the session's last id; either way they must all be above it, in order, or nothing is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from agent_flow.errors import LeaseLostError, SessionBusyError, StoreError, UserError
from agent_flow.events import RunFinished, event_to_json
from agent_flow.sessions._backend import _EventRow
from agent_flow.sessions.models import EVENT_ID_RUN_BITS, Lease, SessionInfo, event_id

__all__ = [
    "INTERRUPTED_SEQ",
    "_LeaseState",
    "_check_ttl",
    "_claimed",
    "_interruption",
    "_new_event_ids",
    "_released",
    "_renewed",
    "_writable",
]

#: The stop reason (`agent_flow.agent.outcome.StopReason.INTERRUPTED`) of a run whose holder died.
_INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class _LeaseState:
    """A session's lease columns: the run holding it (None: none), who, its fence and expiry."""

    run: str | None
    holder: str | None
    fence: int
    expires: datetime | None

    def live(self, now: datetime) -> bool:
        """Whether a lease is held and has not expired at `now`."""
        return self.run is not None and self.expires is not None and self.expires > now

    def holds(self, lease: Lease) -> bool:
        """Whether `lease` is the session's lease now (expired or not)."""
        return self.run == lease.run_id and self.fence == lease.fence


#: The longest time to live a lease may be given (about 31 years): a run renews its lease.
_MAX_TTL = 1e9


#: The ``seq`` of the ``interrupted`` end a claim stores for a dead run: the largest the stores
#: keep (a signed 32-bit column), above any event the dead run may have handed out unsaved.
INTERRUPTED_SEQ: Final = (1 << (EVENT_ID_RUN_BITS - 1)) - 1


def _check_ttl(ttl: float) -> None:
    """Refuse a time to live that is negative, too long or not a number.

    0 is allowed: the lease expires at once (what a test needs to act out a dead holder).
    """
    if not (math.isfinite(ttl) and 0 <= ttl <= _MAX_TTL):
        raise UserError(f"ttl={ttl} is not a time to live; pass 0 to {_MAX_TTL:.0e} seconds")


def _busy(session_id: str, state: _LeaseState) -> SessionBusyError:
    assert state.run is not None
    assert state.expires is not None
    return SessionBusyError(
        f"session {session_id!r} is held by run {state.run!r} ({state.holder}) until "
        f"{state.expires.isoformat()}; wait for that run to end or its lease to expire",
        run_id=state.run,
        holder=state.holder or "",
        fence=state.fence,
    )


def _lost(
    session_id: str, fence: int, state: _LeaseState, run: str | None = None
) -> LeaseLostError:
    mine = f"the lease with fence {fence}" + (f" of run {run!r}" if run is not None else "")
    now = (
        f"run {state.run!r} holds it with fence {state.fence}"
        if state.run is not None
        else f"no run holds it (latest fence {state.fence})"
    )
    return LeaseLostError(
        f"{mine} on session {session_id!r} is no longer its lease ({now}); "
        "nothing was written: stop this run, or claim the session again"
    )


def _claimed(
    session_id: str,
    state: _LeaseState,
    now: datetime,
    *,
    run_id: str,
    holder: str,
    ttl: float,
) -> tuple[_LeaseState, Lease, str | None]:
    """The lease columns after a claim, the `Lease`, and the dead run to end (if any).

    The dead run is the expired, never released lease's run, unless it is `run_id` itself;
    the backend ends it (`_interruption`) if it has no `RunFinished` stored.

    Raises:
        SessionBusyError: A live lease is held.
    """
    if state.live(now):
        raise _busy(session_id, state)
    expires = now + timedelta(seconds=ttl)
    after = _LeaseState(run_id, holder, state.fence + 1, expires)
    lease = Lease(
        session_id=session_id, run_id=run_id, holder=holder, fence=after.fence, expires_at=expires
    )
    dead = state.run if state.run is not None and state.run != run_id else None
    return after, lease, dead


def _renewed(
    session_id: str, state: _LeaseState, now: datetime, lease: Lease, ttl: float
) -> tuple[_LeaseState, Lease]:
    """The lease columns and the `Lease` after renewing `lease` until `now` + `ttl`.

    Raises:
        LeaseLostError: `lease` is not the session's lease any more.
    """
    if not state.holds(lease):
        raise _lost(session_id, lease.fence, state, lease.run_id)
    expires = now + timedelta(seconds=ttl)
    renewed = lease.model_copy(update={"expires_at": expires, "interrupted_run": None})
    return _LeaseState(state.run, state.holder, state.fence, expires), renewed


def _released(state: _LeaseState, lease: Lease) -> _LeaseState | None:
    """The lease columns after releasing `lease`; None when it is stale (nothing to do).

    The fence stays: the next claim gets the number after it.
    """
    if not state.holds(lease):
        return None
    return _LeaseState(None, None, state.fence, None)


def _writable(
    session_id: str,
    state: _LeaseState,
    now: datetime,
    fence: int | None,
    run: str | None = None,
) -> str | None:
    """Check that a write with `fence` (None: un-leased) may go on; return a dead run to end.

    `run` is the writer's run, when it says: then the lease must be that run's too, as a
    session deleted and created again numbers its fences from 1 again.

    The dead run (an un-leased write found an expired lease) is ended like a claim ends it,
    and its lease cleared, in the write's transaction, before the write.

    Raises:
        LeaseLostError: `fence` is not the fence of the lease the session holds (or `run` not
            its run).
        SessionBusyError: No `fence`, and a live lease is held.
    """
    if fence is not None:
        if state.run is None or state.fence != fence or (run is not None and state.run != run):
            raise _lost(session_id, fence, state, run)
        return None
    if state.run is None:
        return None
    if state.live(now):
        raise _busy(session_id, state)
    return state.run


def _new_event_ids(
    session_id: str, events: Sequence[_EventRow], fence: int | None, last_event_id: int
) -> list[int]:
    """The ids of `events` appended to a session whose last id is `last_event_id`.

    Raises:
        StoreError: A fenced event's id would not be above every id before it (its run
            published a ``seq`` it had already written, or out of order): nothing is written.
    """
    if fence is None:
        return [last_event_id + 1 + i for i in range(len(events))]
    ids: list[int] = []
    for event in events:
        new = event_id(event.fence or fence, event.seq)
        if new <= (ids[-1] if ids else last_event_id):
            raise StoreError(
                f"event seq {event.seq} of run {event.run_id!r} under fence {fence} would get id "
                f"{new}, not above the session {session_id!r}'s last id "
                f"{ids[-1] if ids else last_event_id}; a run's events must be saved once each, "
                "in seq order"
            )
        ids.append(new)
    return ids


def _interruption(
    info: SessionInfo, dead_run: str, dead_fence: int, top_seq: int | None, now: datetime
) -> tuple[_EventRow, int, SessionInfo]:
    """The event ending `dead_run`, its id, and the session's description once it is stored.

    `top_seq` is the highest ``seq`` stored for the run (None: no event). The event takes
    the last ``seq`` a stored run can have (``2**31 - 1``: the stores keep ``seq`` in a signed
    32-bit column) under the dead run's fence `dead_fence`:
    the run may have handed out ids its process never saved (live events go out before their
    step is saved), and this id is above every one of them, and below every later run's.

    Raises:
        StoreError: Its id would not be above the session's last id (never, while the lease
            was set: nobody else could write).
    """
    del top_seq  # any stored seq is below the last one
    seq = INTERRUPTED_SEQ
    final = RunFinished(
        run_id=dead_run,
        seq=seq,
        timestamp=now,
        stop_reason=_INTERRUPTED,
        final_text="",
        iterations=0,
        prompt_tokens=0,
        completion_tokens=0,
        duration_ms=0.0,
    )
    row = _EventRow(dead_run, seq, final.kind, event_to_json(final))
    (new,) = _new_event_ids(info.id, (row,), dead_fence, info.last_event_id)
    after = info.model_copy(
        update={
            "status": "interrupted",
            "updated_at": now,
            "event_count": info.event_count + 1,
            "last_event_id": new,
        }
    )
    return row, new, after
