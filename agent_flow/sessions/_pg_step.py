"""A PostgreSQL step's session ``UPDATE``, and the step in one round trip when it can be.

A step written the careful way (`postgres._PostgresBackend._write_step`) is a transaction of
four round trips: ``BEGIN``, the session row read ``FOR UPDATE`` (its lease, revision and
counters decide the write), the statement that appends the rows and updates the session, and
``COMMIT``. Each costs the client a send, a wake-up and a read (about 0.2 ms of CPU on a
two-core machine), more than the statement's own work.

While a run holds the session's lease, the store that wrote the session last already knows
what that read would return: the session as its write left it (`LastWrites`: after a step or
the session's creation, with the lease of its claim since). The step
is then one statement in its own transaction (the connection is in autocommit): its
``UPDATE`` of the session row applies only where the row still is, in every column the step's
rows and new totals were computed from, what the store last wrote (`_GUARD`), and its inserts
only where the ``UPDATE`` applied (they join its ``RETURNING``). Where it did not apply
(another process claimed or wrote the session, the lease was released, the cache had let
the session go), nothing was written, and the careful way runs: it reads the row under its
lock and writes, or raises the error that says why not. Either way the rows written, the ids
and the session returned are those the careful way computes from the same row.

Who owns the cache: one store's backend (a process may have several stores; each knows only
its own writes). It is a hint, never trusted alone: every use is checked by the database in
the write itself.
"""

from __future__ import annotations

from agent_flow.errors import StoreError
from agent_flow.sessions._backend import _stepped, _StepWrite
from agent_flow.sessions._lease import _new_event_ids
from agent_flow.sessions._pg_rows import _insert_rows
from agent_flow.sessions._pg_schema import _Conn
from agent_flow.sessions._usage import USAGE_FIELDS, _assignments, _Totals
from agent_flow.sessions.models import Lease, SessionInfo

__all__ = ["STEP_UPDATE", "LastWrites", "step_update", "write_known"]

#: The session row after a step, with named parameters (``s_...``): it runs inside the step's
#: rows statement (`_pg_rows._insert_rows`), so that a step is at most the locking ``SELECT``
#: and one statement.
STEP_UPDATE = (
    "UPDATE sessions SET status = %(s_status)s, updated_at = %(s_updated_at)s, "
    "steps = %(s_steps)s, entry_count = %(s_entry_count)s, event_count = %(s_event_count)s, "
    "last_event_id = %(s_last_event_id)s, environment_version = %(s_environment_version)s, "
    f"{_assignments('%(s_{name})s')}, "
    "environment = COALESCE(%(s_environment)s, environment), revision = %(s_revision)s "
    "WHERE id = %(sid)s"
)

#: What the row must still hold for a step computed from the store's last write of it: the
#: revision it wrote (every step and import changes it), the lease it wrote under (a claim
#: changes the fence; a release or a dead run's end clears the run) and every column the step
#: reads (`_backend._stepped`) or that decides its deletes (``entry_count``), which a dead
#: run's end changes without a new revision. Then `RETURNING` says whether it applied.
_GUARD = (
    " AND revision = %(g_revision)s AND lease_run = %(g_lease_run)s "
    "AND lease_fence = %(g_lease_fence)s AND status = %(g_status)s AND steps = %(g_steps)s "
    "AND entry_count = %(g_entry_count)s AND event_count = %(g_event_count)s "
    "AND last_event_id = %(g_last_event_id)s "
    "AND environment_version = %(g_environment_version)s "
    f"AND ({', '.join(USAGE_FIELDS)}) IS NOT DISTINCT FROM "
    f"({', '.join(f'%(g_{name})s' for name in USAGE_FIELDS)}) RETURNING 1"
)


def step_update(after: SessionInfo, write: _StepWrite) -> dict[str, object]:
    """The parameters of `STEP_UPDATE` for the session `after` the step `write`."""
    env = write.environment
    return {
        "s_status": after.status,
        "s_updated_at": after.updated_at,
        "s_steps": after.steps,
        "s_entry_count": after.entry_count,
        "s_event_count": after.event_count,
        "s_last_event_id": after.last_event_id,
        "s_environment_version": after.environment_version,
        **{f"s_{name}": value for name, value in _Totals.of(after).fields().items()},
        "s_environment": env.base if env is not None else None,
        "s_revision": write.revision,
    }


async def write_known(
    conn: _Conn, write: _StepWrite, before: SessionInfo, channel: str
) -> SessionInfo | None:
    """Write the step `write` in one statement if the session row is still `before`.

    `before` is the session as this store's last write left it (`LastWrites.before`).
    Returns the session after the step, or None, having written nothing, where the row is
    not `before` any more (the careful way then writes it, or says why not).
    """
    try:
        ids = _new_event_ids(write.session_id, write.events, write.fence, before.last_event_id)
    except StoreError:
        return None  # the careful way raises it, if the row says so too
    after = _stepped(before, write, ids)
    parameters = {**step_update(after, write), **_guard_parameters(write.expected_revision, before)}
    written = await _insert_rows(
        conn,
        write.session_id,
        entries_at=write.keep_entries,
        entries=write.entries,
        changes=write.environment.changes if write.environment is not None else (),
        events_at=before.event_count,
        events=write.events,
        ids=ids,
        checkpoints=write.checkpoints,
        notify=channel if write.events else None,
        update=(STEP_UPDATE + _GUARD, parameters),
        gated=True,
    )
    return after if written else None


def _guard_parameters(revision: str, before: SessionInfo) -> dict[str, object]:
    """The parameters of `_GUARD`: the row is `before`, at `revision`."""
    return {
        "g_revision": revision,
        "g_lease_run": before.lease_run,
        "g_lease_fence": before.lease_fence,
        "g_status": before.status,
        "g_steps": before.steps,
        "g_entry_count": before.entry_count,
        "g_event_count": before.event_count,
        "g_last_event_id": before.last_event_id,
        "g_environment_version": before.environment_version,
        **{f"g_{name}": value for name, value in _Totals.of(before).fields().items()},
    }


class LastWrites:
    """Each session as this store last wrote it: (its revision, its description).

    Kept for the `_MAX` sessions written most recently (a few hundred bytes each); a session
    let go is written the careful way next time.
    """

    _MAX = 1024

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[str, SessionInfo]] = {}

    def before(self, write: _StepWrite) -> SessionInfo | None:
        """The session `write` was planned against, if it is the one last written here.

        Only for a step that the one statement can write: under a lease (the careful way ends
        a dead run for an un-leased write), deleting nothing (no entries replaced, no
        environment changes trimmed).
        """
        known = self._sessions.get(write.session_id)
        if known is None or known[0] != write.expected_revision:
            return None
        before = known[1]
        env = write.environment
        if (
            write.fence is None
            or before.lease_fence != write.fence
            or before.lease_run is None
            or (write.lease_run is not None and before.lease_run != write.lease_run)
            or write.keep_entries != before.entry_count
            or (env is not None and (env.reset or env.trim_through > 0))
        ):
            return None
        return before

    def wrote(self, revision: str, after: SessionInfo) -> None:
        """Remember the session as a write left it (the one written longest ago goes first)."""
        sessions = self._sessions
        sessions.pop(after.id, None)  # to the end of the order
        sessions[after.id] = (revision, after)
        if len(sessions) > self._MAX:
            del sessions[next(iter(sessions))]

    def claimed(self, lease: Lease) -> None:
        """The session's lease is now `lease`: what the row holds if nothing else changed.

        A claim that ended a dead run changed more (its status, counts, last id): the write's
        guard finds that, and the careful way writes the step.
        """
        known = self._sessions.get(lease.session_id)
        if known is not None:
            update = {"lease_run": lease.run_id, "lease_fence": lease.fence}
            self._sessions[lease.session_id] = (known[0], known[1].model_copy(update=update))

    def forget(self, session_id: str) -> None:
        """Forget the session (a write failed, or it was deleted)."""
        self._sessions.pop(session_id, None)
