"""Step batches: what a run's task writes to its SSE clients in one step goes out in one write.

A task runs in steps: from one wait to the next, without letting any other task in. A run
publishes several events in most steps (after a tool returns: ``tool_call_completed``,
``environment_updated``, ``iteration_started``, ``context_built``, then it waits for the
model), and each was one ``send`` to the client's socket. `batched_steps` wraps the run's
coroutine so that a step holds the frames its events make (`StepBatch.hold`) and writes them
when the step ends, as the task waits or finishes: one system call for each client per step,
not per event. No event waits for anything but the rest of the step it was published in (the
run's own synchronous work, not other tasks' turns on the event loop, which is what a flush
scheduled with ``call_soon`` waits for under load).

Writes made outside a batched step (an event published by a request's task, or by a task a
run starts, such as one of its parallel tool calls) go out at once, as before: `current`
is None there.

The batch belongs to the thread's running step: `current` is set only while the wrapped
coroutine runs, and every step flushes its writers before it hands control back, so a held
frame never waits past the step and never overtakes a write made after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

from agent_flow._coroutines import CoroutineWrapper
from agent_flow._eager import stepped

__all__ = ["StepBatch", "batched_steps", "current"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

_state = threading.local()


class StepBatch:
    """The flushes owed at the end of the current step, in the order they were first held."""

    __slots__ = ("_flushes",)

    def __init__(self) -> None:
        self._flushes: list[Callable[[], None]] = []

    def hold(self, flush: Callable[[], None]) -> None:
        """Call `flush` when the step ends (a writer holds its first frame of the step)."""
        self._flushes.append(flush)

    def flush(self) -> None:
        """Call every held flush once, in order, and start over.

        A flush that raises is logged: one client's write never fails the run that published.
        Every flush is called even when one raises what is no `Exception` (which is raised
        again after them).
        """
        if not self._flushes:
            return  # most steps: nothing was pushed to a client
        flushes, self._flushes = self._flushes, []
        fatal: BaseException | None = None
        for flush in flushes:
            try:
                flush()
            except Exception:
                logger.exception("writing a step's events to a client failed")
            except BaseException as err:  # KeyboardInterrupt, say: the other clients first
                fatal = fatal or err
        if fatal is not None:
            raise fatal


def current() -> StepBatch | None:
    """The batch of the step running now, or None outside a batched step."""
    return getattr(_state, "batch", None)


def batched_steps(coroutine: Coroutine[Any, Any, _T]) -> Coroutine[Any, Any, _T]:
    """`coroutine`, whose every step writes its held frames when it ends (see the module doc).

    Give it to ``asyncio.create_task``: the task steps it as it would the coroutine.
    """
    return _Batched(coroutine)


class _Batched(CoroutineWrapper[_T]):
    __slots__ = ("_batch",)

    def __init__(self, coroutine: Coroutine[Any, Any, _T]) -> None:
        super().__init__(coroutine)
        self._batch = StepBatch()

    def send(self, value: Any) -> Any:
        return self._step(self._coroutine.send, value)

    def throw(self, *args: Any) -> Any:
        return self._step(self._coroutine.throw, *args)

    def _step(self, step: Callable[..., Any], *args: Any) -> Any:
        """One step of the coroutine with this batch current, then its flushes."""
        previous = getattr(_state, "batch", None)
        _state.batch = self._batch
        try:
            return step(*args)
        finally:
            _state.batch = previous
            self._batch.flush()

    def __await__(self) -> Generator[Any, None, _T]:
        # Awaited rather than made a task, it batches the steps of the awaiting task.
        return stepped(self.send, self.throw)
