"""The interactive parts of the command: reading stdin, asking approvals, and Ctrl-C.

`_LineReader` reads lines without blocking the event loop, `_read_or_stop` waits on one or on
a stop request, `_Approver` answers approval requests (``--yes`` or ``--yes-all``, a terminal
prompt, or a refusal), and `_Interrupts` turns the first Ctrl-C into a cancel and the second
into a quit.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import IO, TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from agent_flow.cli._prompt import _Prompter
    from agent_flow.tools import ApprovalRequest, ApprovalResponse

_T = TypeVar("_T")


class _LineReader:
    """Reads lines from a stream on a daemon thread.

    Waiting never blocks the event loop, and an abandoned wait (Ctrl-C at a prompt) leaves
    nothing behind that the interpreter must join on exit.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._queue: asyncio.Queue[str | None] | None = None
        self._eof = False

    async def readline(self) -> str | None:
        """The next line without its newline, or None at the end of the input."""
        if self._eof:
            return None
        if self._queue is None:
            self._queue = asyncio.Queue()
            thread = threading.Thread(
                target=self._pump,
                args=(asyncio.get_running_loop(), self._queue),
                name="agent-flow-stdin",
                daemon=True,
            )
            thread.start()
        line = await self._queue.get()
        if line is None:
            self._eof = True
            return None
        return line.rstrip("\n")

    def _pump(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
        while True:
            try:
                line = self._stream.readline()
            except (OSError, ValueError):
                line = ""
            try:
                loop.call_soon_threadsafe(queue.put_nowait, line or None)
            except RuntimeError:  # the loop is closed: nobody is reading any more
                return
            if not line:
                return


class _Approver:
    """Answers approval requests: the flags approve, a terminal asks, anything else refuses.

    ``--yes`` approves low- and medium-risk calls; high-risk ones (``run_command``, tools an
    MCP server marks destructive) need ``--yes-all`` or an answer at the terminal.

    Args:
        auto: Approve low- and medium-risk calls (``--yes``).
        prompter: Who is asked (`agent_flow.cli._prompt`).
        before_asking: Called first (stops a spinner that would draw over the question).
        auto_high_risk: Approve every call, high-risk ones included (``--yes-all``).
    """

    def __init__(
        self,
        *,
        auto: bool,
        prompter: _Prompter,
        before_asking: Callable[[], None],
        auto_high_risk: bool = False,
    ) -> None:
        self.auto = auto
        self.auto_high_risk = auto_high_risk
        self.prompter = prompter
        self.before_asking = before_asking

    async def __call__(self, request: ApprovalRequest) -> ApprovalResponse:
        # Here, not at module level: the parser imports this module for ``--help``.
        from agent_flow.tools import ApprovalResponse, RiskLevel

        if self.auto_high_risk:
            return ApprovalResponse(approved=True, reason="approved by --yes-all")
        high = request.risk is RiskLevel.HIGH
        if self.auto and not high:
            return ApprovalResponse(approved=True, reason="approved by --yes")
        if not self.prompter.interactive:
            if self.auto:
                reason = (
                    f"{request.tool_name} is a high-risk tool, which --yes does not approve "
                    "(stdin is not a terminal to ask); rerun with --yes-all to approve it too"
                )
            else:
                flag = "--yes-all" if high else "--yes"
                reason = (
                    f"nobody could be asked (stdin is not a terminal); rerun with {flag} to "
                    "approve such calls"
                )
            return ApprovalResponse(approved=False, reason=reason)
        self.before_asking()
        answer = await self.prompter.answer(
            f"  allow {request.tool_name} ({request.risk.value} risk)? [y/N] "
        )
        approved = (answer or "").strip().lower() in ("y", "yes")
        return ApprovalResponse(
            approved=approved,
            reason="approved at the terminal" if approved else "refused at the terminal",
        )


class _Interrupts:
    """While active, Ctrl-C calls `on_interrupt` once; pressing it again quits at once.

    Only the main thread can take signals; elsewhere (an embedding, a test) this does nothing.
    """

    def __init__(self, on_interrupt: Callable[[], None]) -> None:
        self.on_interrupt = on_interrupt
        self.count = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> _Interrupts:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, self._handle)
        except (NotImplementedError, RuntimeError, ValueError):
            return self
        self._loop = loop
        return self

    def _handle(self) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.on_interrupt()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)


async def _read_or_stop(read: Awaitable[_T], stop: asyncio.Event) -> _T | None:
    """What `read` gives, or None as soon as `stop` is set (the read is then cancelled)."""
    reading = asyncio.ensure_future(read)
    stopped = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in (reading, stopped):
        if task not in done:
            task.cancel()
    if reading not in done:
        await asyncio.gather(reading, return_exceptions=True)
        return None
    return reading.result()
