"""The ``--json`` view of a run: one `event_to_json` line per event, every event as it is.

`agent_flow.cli.render` exports `JsonLinesWriter` beside the trace's `EventRenderer`.
"""

from __future__ import annotations

from typing import IO

from agent_flow.events import AgentEvent, event_to_json

__all__ = ["JsonLinesWriter"]


class JsonLinesWriter:
    """Writes each event as one JSON line (`event_to_json`); use as an `EventBus` hook.

    Args:
        stream: Where the lines go.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def __call__(self, event: AgentEvent) -> None:
        """Write one event."""
        self.stream.write(event_to_json(event) + "\n")
        self.stream.flush()
