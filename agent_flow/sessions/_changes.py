"""`_Changes`: wakes the followers of a session when new events of it may be stored.

A store signals a session after each of its own step saves, and a PostgreSQL store also on
each notification another process's save sent (`agent_flow.sessions._pg_notify`). A follower
takes its waiter *before* it reads the store, then waits on it: a save that commits after the
read signals that waiter, one that committed before is in the read, so none is missed.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["_Changes"]


class _Changes:
    """One `asyncio.Event` per session with followers, replaced each time it is set."""

    def __init__(self) -> None:
        self._waiters: dict[str, asyncio.Event] = {}

    def waiter(self, session_id: str) -> asyncio.Event:
        """The event the next change of `session_id` sets (take it before reading)."""
        event = self._waiters.get(session_id)
        if event is None:
            event = self._waiters[session_id] = asyncio.Event()
        return event

    def signal(self, session_id: str) -> None:
        """Wake every follower of `session_id`."""
        event = self._waiters.pop(session_id, None)
        if event is not None:
            event.set()

    def signal_all(self) -> None:
        """Wake every follower (notifications may have been lost: everyone re-reads)."""
        waiters, self._waiters = self._waiters, {}
        for event in waiters.values():
            event.set()

    @staticmethod
    async def wait(event: asyncio.Event, seconds: float) -> None:
        """Wait until `event` is set or `seconds` passed, whichever comes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()
