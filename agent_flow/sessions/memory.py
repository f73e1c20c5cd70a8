"""`InMemorySessionStore`: the semantics of the SQLite store, in this process's memory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent_flow.sessions._backend import (
    _checkpoint_taken,
    _EventQuery,
    _EventRow,
    _exists,
    _Import,
    _not_found,
    _StaleError,
    _stepped,
    _StepWrite,
    _Stored,
)
from agent_flow.sessions._base import _R, _OnWorker, _StoreBase
from agent_flow.sessions._lease import (
    _claimed,
    _interruption,
    _LeaseState,
    _new_event_ids,
    _released,
    _renewed,
    _writable,
)
from agent_flow.sessions.models import Checkpoint, Lease, SessionInfo

__all__ = ["InMemorySessionStore"]


_NO_LEASE = _LeaseState(None, None, 0, None)


@dataclass(slots=True)
class _MemorySession:
    info: SessionInfo
    revision: str
    entries: list[str] = field(default_factory=list)
    environment: str | None = None
    changes: dict[int, str] = field(default_factory=dict)
    events: list[tuple[int, _EventRow]] = field(default_factory=list)  # (event id, row)
    checkpoints: dict[tuple[str, int], Checkpoint] = field(default_factory=dict)
    lease: _LeaseState = _NO_LEASE

    def set_lease(self, lease: _LeaseState) -> None:
        self.lease = lease
        self.info = self.info.model_copy(
            update={"lease_run": lease.run, "lease_fence": lease.fence}
        )

    def end_dead_run(self, dead: _LeaseState, now: datetime) -> bool:
        """End `dead.run` (see `_lease._interruption`) unless it ended; whether it did."""
        assert dead.run is not None
        mine = [row for _, row in self.events if row.run_id == dead.run]
        if any(row.kind == "run_finished" for row in mine):
            return False
        top = max((row.seq for row in mine), default=None)
        row, number, self.info = _interruption(self.info, dead.run, dead.fence, top, now)
        self.events.append((number, row))
        return True


def _check_free(session: _MemorySession, rows: tuple[Checkpoint, ...]) -> None:
    keys = [(c.run_id, c.position) for c in rows]
    if len(set(keys)) < len(keys) or any(key in session.checkpoints for key in keys):
        raise _checkpoint_taken(session.info.id, rows)


class _MemoryBackend:
    """The same operations as `_SQLiteBackend` over dicts of serialized rows."""

    def __init__(self) -> None:
        self._sessions: dict[str, _MemorySession] = {}

    def open(self) -> None:
        pass

    def _get(self, session_id: str) -> _MemorySession:
        session = self._sessions.get(session_id)
        if session is None:
            raise _not_found(session_id)
        return session

    def create(self, info: SessionInfo, revision: str) -> None:
        if info.id in self._sessions:
            raise _exists(info.id)
        self._sessions[info.id] = _MemorySession(info=info, revision=revision)

    def info(self, session_id: str) -> SessionInfo:
        return self._get(session_id).info

    def read(self, session_id: str, with_events: bool) -> _Stored:
        session = self._get(session_id)
        return _Stored(
            info=session.info,
            revision=session.revision,
            entries=tuple(session.entries),
            environment=session.environment,
            changes=tuple(session.changes[v] for v in sorted(session.changes)),
            events=tuple(e.data for _, e in session.events) if with_events else (),
        )

    def write_step(self, write: _StepWrite) -> SessionInfo:
        session = self._get(write.session_id)
        now = datetime.now(UTC)
        dead = _writable(session.info.id, session.lease, now, write.fence, write.lease_run)
        if session.revision != write.expected_revision:
            raise _StaleError
        _check_free(session, write.checkpoints)
        if dead is not None:
            # An expired lease, never released: end it, as a claim would, then write. (Only
            # an un-leased write gets here: nothing below can fail.)
            session.end_dead_run(session.lease, now)
            session.set_lease(_LeaseState(None, None, session.lease.fence, None))
        ids = _new_event_ids(session.info.id, write.events, write.fence, session.info.last_event_id)
        del session.entries[write.keep_entries :]
        session.entries.extend(e.data for e in write.entries)
        env = write.environment
        if env is not None:
            if env.reset:
                session.changes.clear()
            else:
                for version in [v for v in session.changes if v <= env.trim_through]:
                    del session.changes[version]
            session.changes.update(env.changes)
            session.environment = env.base
        session.events.extend(zip(ids, write.events, strict=True))
        session.checkpoints.update(((c.run_id, c.position), c) for c in write.checkpoints)
        session.info = _stepped(session.info, write, ids)
        session.revision = write.revision
        return session.info

    def sessions(self, limit: int, owner: str | None) -> list[SessionInfo]:
        infos = sorted(
            (s.info for s in self._sessions.values() if owner is None or s.info.owner == owner),
            key=lambda i: i.id,
        )
        infos.sort(key=lambda i: i.updated_at, reverse=True)
        return infos[:limit]

    def claim(self, session_id: str, run_id: str, holder: str, ttl: float) -> Lease:
        session = self._get(session_id)
        now = datetime.now(UTC)
        after, lease, dead = _claimed(
            session_id, session.lease, now, run_id=run_id, holder=holder, ttl=ttl
        )
        if dead is not None and session.end_dead_run(session.lease, now):
            lease = lease.model_copy(update={"interrupted_run": dead})
        session.set_lease(after)
        return lease

    def renew(self, lease: Lease, ttl: float) -> Lease:
        session = self._get(lease.session_id)
        after, renewed = _renewed(lease.session_id, session.lease, datetime.now(UTC), lease, ttl)
        session.set_lease(after)
        return renewed

    def release(self, lease: Lease) -> None:
        session = self._get(lease.session_id)
        after = _released(session.lease, lease)
        if after is not None:
            session.set_lease(after)

    def events(self, session_id: str, query: _EventQuery) -> list[tuple[int, str]]:
        rows = self._get(session_id).events
        if query.after_id is not None:
            rows = [(number, e) for number, e in rows if number > query.after_id]
        else:
            rows = rows[query.offset :]
        if query.run_id is not None:
            rows = [
                (number, e)
                for number, e in rows
                if e.run_id == query.run_id and e.seq > query.after_seq
            ]
        return [(number, e.data) for number, e in rows[: query.limit]]

    def write_checkpoints(
        self,
        session_id: str,
        rows: tuple[Checkpoint, ...],
        synced: bool,
        fence: int | None,
        lease_run: str | None,
    ) -> None:
        session = self._get(session_id)
        _writable(session_id, session.lease, datetime.now(UTC), fence, lease_run)
        _check_free(session, rows)
        session.checkpoints.update(((c.run_id, c.position), c) for c in rows)

    def checkpoints(self, session_id: str, run_id: str) -> list[Checkpoint]:
        stored = self._get(session_id).checkpoints.values()
        return sorted((c for c in stored if c.run_id == run_id), key=lambda c: c.position)

    def insert(self, session: _Import) -> None:
        if session.info.id in self._sessions:
            raise _exists(session.info.id)
        self._sessions[session.info.id] = _MemorySession(
            info=session.info,
            revision=session.revision,
            entries=[e.data for e in session.entries],
            environment=session.environment,
            changes=dict(session.changes),
            events=list(
                zip(
                    _new_event_ids(session.info.id, session.events, None, -1),
                    session.events,
                    strict=True,
                )
            ),
        )

    def delete(self, session_id: str) -> None:
        self._get(session_id)
        del self._sessions[session_id]

    def close(self) -> None:
        self._sessions.clear()


async def _inline(fn: Callable[[], _R]) -> _R:
    return fn()


class InMemorySessionStore(_StoreBase):
    """A `SessionStore` in this process's memory, with the semantics of `SQLiteSessionStore`.

    Sessions are kept serialized, exactly as the SQLite store keeps them, so `load` returns
    fresh objects and the same round trips hold; everything is lost on `close`. Meant for
    tests and throwaway runs.
    """

    def __init__(self) -> None:
        super().__init__(_OnWorker(_MemoryBackend(), _inline), "in memory")

    def __repr__(self) -> str:
        return "InMemorySessionStore()"
