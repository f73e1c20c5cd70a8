"""Where `replay` and `sessions diff` read a session: a stored session's id, or an export file.

A SESSION argument that names an existing file is read as a JSON-lines export (what
`agent-flow sessions export ID -o FILE` wrote); anything else is a session id in the store that
``--db`` or ``--config`` selects. An export is validated whole, as an import would be, through
an in-memory store, so a truncated or altered file is refused with the line at fault.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from agent_flow.cli._exit import EXIT_USAGE, _Failure
from agent_flow.cli._sessions import _stored
from agent_flow.errors import StoreError
from agent_flow.events import AgentEvent
from agent_flow.sessions import InMemorySessionStore, SessionState


@dataclass(frozen=True)
class _Loaded:
    """A session read whole: its state, its events, and where it came from."""

    state: SessionState
    events: list[AgentEvent]
    origin: str


def _is_export(source: str) -> bool:
    path = Path(source)
    if path.is_dir():
        raise _Failure(
            EXIT_USAGE,
            f"{source} is a directory; give a session id or a file written by "
            "`agent-flow sessions export ID -o FILE`",
        )
    return path.is_file()


async def _load_session(source: str, args: argparse.Namespace) -> _Loaded:
    """Load `source`: an export file if one exists at that path, else a stored session's id.

    Raises:
        _Failure: The path is a directory, or the file is not a valid export (exit 2).
        SessionNotFoundError: No stored session has that id.
    """
    if _is_export(source):
        async with InMemorySessionStore() as memory:
            try:
                info = await memory.import_(source)
            except StoreError as err:
                raise _Failure(EXIT_USAGE, f"{source} is not a session export: {err}") from err
            state = await memory.load(info.id)
            events = await memory.events(info.id)
        return _Loaded(state, events, source)
    async with _stored(args, source) as store:
        state = await store.load(source)
        events = await store.events(source)
    return _Loaded(state, events, f"session {source}")
