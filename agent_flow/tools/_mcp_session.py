"""One started MCP server session's state (`_Session`), and how its errors read.

Owned by `MCPConnection` (`_mcp_connection`): a session is made by its `_open`, lives in a task
of its own (`_serve`), and is retired when it breaks or the connection closes.
"""

from __future__ import annotations

import asyncio

from mcp import ClientSession

from agent_flow.tools._mcp_catalog import Catalog
from agent_flow.tools._mcp_transport import ServerOutput

__all__ = ["_Session", "_describe", "_innermost"]


class _Session:
    """One started server session, owned by its own task."""

    def __init__(self) -> None:
        self.client: ClientSession | None = None
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.catalog = Catalog()
        self.broken = False  # the connection failed: restart before the next call
        self.suspect = False  # a call timed out or was cancelled: ping before the next call
        self.output = ServerOutput()  # its stderr tail; closed once its messages stop

    @property
    def usable(self) -> bool:
        return (
            self.client is not None
            and not self.broken
            and not self.output.closed
            and self.task is not None
            and not self.task.done()
        )

    def with_stderr(self, text: str) -> str:
        """`text`, then the HTTP error the server answered and its last stderr lines, if any."""
        if self.output.http_status is not None:
            text = f"{text} (the server answered HTTP {self.output.http_status})"
        tail = self.output.tail()
        return f"{text}; its stderr ended with: {tail}" if tail else text


def _innermost(err: BaseException) -> BaseException:
    """The first real error, looking inside exception groups."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def _describe(err: BaseException) -> str:
    """``Type: message`` of the first real error, looking inside exception groups."""
    err = _innermost(err)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
