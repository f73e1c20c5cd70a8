"""Reading a session's stored events: from a position or after an id, waiting for more, following.

`_EventReads` is the part of `_base._StoreBase` that reads events; the store core mixes it in.
Two ways to say where to read on from:

- a position (``offset``: how many of the session's events were read already), the original
  API, kept for its callers;
- an event id (``after_id``: the last id seen; see `agent_flow.sessions.models.event_id`): an id
  names one event for good, so a client that reconnects, to this process or to another, reads
  on from the id it saw last. The ``*_with_ids`` methods return each event with its id.

A follower takes the session's waiter before it reads (see `_changes`), so no save is missed
between a read and the wait.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator

from agent_flow._defaults import EVENTS_POLL_SECONDS
from agent_flow.errors import UserError
from agent_flow.events import AgentEvent
from agent_flow.sessions._backend import _decode_event, _EventQuery
from agent_flow.sessions._changes import _Changes

__all__ = ["_EventReads"]

#: How long one wait of a follower lasts before it reads again (it then waits again).
_FOLLOW_WAIT = 60.0


class _EventReads:
    """The event reads of a store, mixed into `_StoreBase` (which sets `_changes`)."""

    _changes: _Changes

    #: How long a follower of a session waits for a signal before it reads the store again.
    _follow_poll: float = EVENTS_POLL_SECONDS

    async def _listen(self) -> None:
        """Start hearing of other processes' saves (a PostgreSQL store's LISTEN); else none."""

    async def _event_rows(self, session_id: str, query: _EventQuery) -> list[tuple[int, str]]:
        """The stored (id, JSON) rows `query` selects (the store core asks its backend)."""
        raise NotImplementedError

    async def _read(self, session_id: str, query: _EventQuery) -> list[tuple[int, AgentEvent]]:
        if query.offset < 0 or (query.limit is not None and query.limit < 0):
            raise UserError(f"offset={query.offset} and limit={query.limit} must not be negative")
        if query.after_seq >= 0 and query.run_id is None:
            raise UserError(
                f"after_seq={query.after_seq} needs run_id: sequence numbers count within one run"
            )
        if query.after_id is not None and query.offset:
            raise UserError(
                f"offset={query.offset} and after_id={query.after_id} both say where to start; "
                "pass one of them"
            )
        rows = await self._event_rows(session_id, query)
        return [(number, _decode_event(data, session_id)) for number, data in rows]

    async def events(
        self,
        session_id: str,
        *,
        offset: int = 0,
        run_id: str | None = None,
        after_seq: int = -1,
        limit: int | None = None,
        after_id: int | None = None,
    ) -> builtins.list[AgentEvent]:
        """Return the session's events in the order saved.

        Args:
            session_id: The session.
            offset: Skip the session's first `offset` events (to read on from where one left
                off, pass the number of events already read).
            run_id: Only the events of this run.
            after_seq: With `run_id`: only events with a larger ``seq``.
            limit: At most this many events.
            after_id: Only the events whose id is above this one (the last id seen; see
                `events_with_ids`), instead of `offset`.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `limit`, `after_seq` without `run_id`, or both
                `offset` and `after_id`.
            StoreError: A stored event cannot be read back.
        """
        query = _EventQuery(offset, after_id, run_id, after_seq, limit)
        return [event for _, event in await self._read(session_id, query)]

    async def events_with_ids(
        self, session_id: str, *, after_id: int = -1, limit: int | None = None
    ) -> builtins.list[tuple[int, AgentEvent]]:
        """Return the session's events whose id is above `after_id`, with their ids, in order.

        Args:
            session_id: The session.
            after_id: The last id already seen (-1: from the first event).
            limit: At most this many events.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `limit`.
            StoreError: A stored event cannot be read back.
        """
        return await self._read(session_id, _EventQuery(after_id=after_id, limit=limit))

    async def wait_for_events(
        self, session_id: str, *, offset: int = 0, wait: float
    ) -> builtins.list[AgentEvent]:
        """Return the session's events from position `offset` on, waiting for some if none.

        Returns at once when events are stored past `offset`; otherwise when one is saved (by
        this store, or by any process: a PostgreSQL store is notified, the others re-read
        every `EVENTS_POLL_SECONDS`), or with ``[]`` when `wait` seconds passed.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `wait`.
        """
        found = await self._wait(session_id, _EventQuery(offset=offset), wait)
        return [event for _, event in found]

    async def wait_for_events_with_ids(
        self, session_id: str, *, after_id: int = -1, wait: float
    ) -> builtins.list[tuple[int, AgentEvent]]:
        """Return the session's events above id `after_id` with their ids, waiting for some.

        As `wait_for_events`, from an event id rather than a position.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `wait`.
        """
        return await self._wait(session_id, _EventQuery(after_id=after_id), wait)

    async def _wait(
        self, session_id: str, query: _EventQuery, wait: float
    ) -> list[tuple[int, AgentEvent]]:
        if wait < 0:
            raise UserError(f"wait={wait} is negative; pass 0 or more seconds")
        await self._listen()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            waiter = self._changes.waiter(session_id)  # before the read: see _changes
            found = await self._read(session_id, query)
            remaining = deadline - loop.time()
            if found or remaining <= 0:
                return found
            await self._changes.wait(waiter, min(remaining, self._follow_poll))

    async def follow_events(
        self, session_id: str, *, offset: int = 0, after_id: int | None = None
    ) -> AsyncIterator[AgentEvent]:
        """Yield the session's events from position `offset` on, then each one as it is saved.

        Every event once, in the stored order, with no gap, whichever process saves it. It
        never ends by itself: stop iterating (or cancel) when done, e.g. at the `RunFinished`
        of the run you watch. Events arrive when their step is saved, not as published.

        Args:
            session_id: The session.
            offset: The position to start from.
            after_id: Start after this event id instead (see `follow_events_with_ids`).

        Raises:
            SessionNotFoundError: No session has that id (or it was deleted meanwhile).
            UserError: Both `offset` and `after_id`.
        """
        if after_id is not None:
            if offset:
                raise UserError(
                    f"offset={offset} and after_id={after_id} both say where to start; pass "
                    "one of them"
                )
            async for _, event in self.follow_events_with_ids(session_id, after_id=after_id):
                yield event
            return
        while True:
            events = await self.wait_for_events(session_id, offset=offset, wait=_FOLLOW_WAIT)
            offset += len(events)
            for event in events:
                yield event

    async def follow_events_with_ids(
        self, session_id: str, *, after_id: int = -1
    ) -> AsyncIterator[tuple[int, AgentEvent]]:
        """Yield (id, event) for the session's events above id `after_id`, then as saved.

        As `follow_events`; to resume after a disconnection, pass the last id received.

        Raises:
            SessionNotFoundError: No session has that id (or it was deleted meanwhile).
        """
        while True:
            found = await self.wait_for_events_with_ids(
                session_id, after_id=after_id, wait=_FOLLOW_WAIT
            )
            for number, event in found:
                after_id = number
                yield number, event
