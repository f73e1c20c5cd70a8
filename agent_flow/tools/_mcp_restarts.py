"""`RestartBudget`: how often an MCP connection may still restart its server.

A server that crash-loops must be given up on, or every call would wait for another doomed
start; one that restarts now and then (a deploy, a nightly restart of an HTTP server, which
ends its sessions) must not lose its tools for the rest of the process. So restarts count
against ``max_restarts`` only while they are younger than ``restart_window`` seconds, the
way a service manager limits restarts per interval. Without a window they count for the
connection's life.

Owner: one `MCPConnection`, which spends from it under its lock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

__all__ = ["RestartBudget"]


class RestartBudget:
    """`max_restarts` restarts within `window` seconds (None: ever).

    Args:
        max_restarts: The most restarts within the window.
        window: Seconds a restart counts; None counts it for good.
        clock: Monotonic seconds (the tests give their own).
    """

    def __init__(
        self,
        max_restarts: int,
        window: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self._clock = clock
        #: When each restart still counted was made, oldest first.
        self._made: deque[float] = deque()
        #: Every restart made, counted or not any more.
        self.spent = 0

    def refusal(self) -> str | None:
        """Why no restart may be made now (the end of a sentence), or None if one may."""
        now = self._clock()
        if self.window is not None:
            while self._made and now - self._made[0] >= self.window:
                self._made.popleft()
        count = len(self._made)
        if count < self.max_restarts:
            return None
        times = "time" if count == 1 else "times"
        if self.window is None:
            return f"was already restarted {count} {times}, the limit; it is not restarted again"
        if not self._made:  # max_restarts is 0: never
            return "may not be restarted (max_restarts = 0)"
        wait = math.ceil(max(self._made[0] + self.window - now, 1.0))
        return (
            f"was restarted {count} {times} in the last {self.window:g}s, the limit "
            f"(max_restarts); it is tried again in {wait}s"
        )

    def spend(self) -> None:
        """Count a restart made now."""
        self._made.append(self._clock())
        self.spent += 1
