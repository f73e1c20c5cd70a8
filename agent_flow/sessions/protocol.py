"""The `SessionStore` protocol every session store implements, and `default_store_path`."""

from __future__ import annotations

import builtins
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, Self

from agent_flow._types import JsonObject
from agent_flow.environment import Environment
from agent_flow.events import AgentEvent
from agent_flow.history import History
from agent_flow.sessions.models import SessionInfo, SessionState, SessionStatus

__all__ = ["SessionStore", "default_store_path"]


def default_store_path() -> Path:
    """Return where `SQLiteSessionStore` keeps sessions when given no path.

    ``$AGENT_FLOW_HOME/sessions.db`` if that variable is set, else
    ``$XDG_DATA_HOME/agent_flow/sessions.db`` if that is set to an absolute path, else
    ``~/.local/share/agent_flow/sessions.db``.
    """
    home = os.environ.get("AGENT_FLOW_HOME")
    if home:
        return Path(home).expanduser() / "sessions.db"
    data = os.environ.get("XDG_DATA_HOME")
    if data and Path(data).is_absolute():
        return Path(data) / "agent_flow" / "sessions.db"
    return Path.home() / ".local" / "share" / "agent_flow" / "sessions.db"


class SessionStore(Protocol):
    """Where sessions live; every method is a coroutine, every failure a `StoreError`.

    Implementations: `SQLiteSessionStore`, `InMemorySessionStore`. Use one as an async context
    manager, or call `close` when done.
    """

    async def create(
        self,
        *,
        session_id: str | None = None,
        agent: str = "agent",
        title: str = "",
        metadata: JsonObject | None = None,
        task: str | None = None,
    ) -> SessionInfo:
        """Create an empty session (status ``active``) and return its description.

        Raises:
            UserError: `session_id` is not a valid id.
            StoreError: A session with that id exists.
        """
        ...

    async def save_step(
        self,
        session_id: str,
        *,
        history: History,
        environment: Environment,
        events: Sequence[AgentEvent] = (),
        status: SessionStatus | None = None,
    ) -> SessionInfo:
        """Save one step in one transaction: the history and environment now, the new events.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: `status` is not a `SessionStatus`.
        """
        ...

    async def load(self, session_id: str) -> SessionState:
        """Return the session as saved at its last step.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def info(self, session_id: str) -> SessionInfo:
        """Return the session's description without loading it.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def list(self, *, limit: int = 50) -> builtins.list[SessionInfo]:
        """Return up to `limit` sessions, the most recently updated first."""
        ...

    async def events(
        self,
        session_id: str,
        *,
        offset: int = 0,
        run_id: str | None = None,
        after_seq: int = -1,
        limit: int | None = None,
    ) -> builtins.list[AgentEvent]:
        """Return the session's events in the order saved.

        Args:
            session_id: The session.
            offset: Skip the session's first `offset` events (to read on from where one left
                off, pass the number of events already read).
            run_id: Only the events of this run.
            after_seq: With `run_id`: only events with a larger ``seq``.
            limit: At most this many events.

        Raises:
            SessionNotFoundError: No session has that id.
            UserError: A negative `offset` or `limit`, or `after_seq` without `run_id`.
        """
        ...

    async def export(self, session_id: str, target: str | Path | IO[str]) -> None:
        """Write the session as JSON lines to a file path or a text stream.

        The format is described in `agent_flow.sessions.export`.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def import_(
        self, source: str | Path | IO[str], *, session_id: str | None = None
    ) -> SessionInfo:
        """Store a session read from what `export` wrote, under `session_id` if given.

        Raises:
            StoreError: The source is not a complete export, or the id is taken.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Delete the session and everything stored with it.

        Raises:
            SessionNotFoundError: No session has that id.
        """
        ...

    async def close(self) -> None:
        """Release the store; later calls raise `StoreError`. Closing twice is harmless."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
