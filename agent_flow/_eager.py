"""Running a coroutine in the caller's task where asyncio would give it a task of its own.

`start_eagerly`: start a coroutine in the caller's task, as Python 3.12's eager tasks do.

A new task runs at the loop's next turn, behind every callback already ready: on a busy loop
that is tens or hundreds of milliseconds. Work that can start at once (a write to a socket
that takes it, a store's save planned in memory before its first I/O) need not wait for that
turn. `start_eagerly` runs the awaitable in the caller's task up to its first wait; only
the rest, if any, goes on in a task. Python 3.11 has no ``eager_start``: this is that, for
one awaitable.

`to_the_end`: await a started future to its end even when the caller is cancelled meanwhile
(a write, a claim: work that must not be left half-known).

`in_own_context`: await a coroutine in the caller's task, but in a copy of the caller's
context, as a task of its own would run it: a context variable it sets stays its own. The
copy's `OWN_CONTEXT` is a new marker, so code that must reset a context variable's token in
the context that set it can tell the copy from its task's context (``asyncio.current_task``
is the same in both).

The first part of `start_eagerly`'s awaitable runs in the caller's task, so it must not depend
on which task runs it (an ``asyncio.timeout`` entered there would belong to the caller).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["OWN_CONTEXT", "finished", "in_own_context", "start_eagerly", "stepped", "to_the_end"]

_T = TypeVar("_T")

_NOT_STARTED = object()

#: A marker of the `in_own_context` copy running now (None in a task's own context).
OWN_CONTEXT: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "agent_flow.own_context", default=None
)


def start_eagerly(awaitable: Awaitable[_T]) -> asyncio.Future[_T]:
    """Run `awaitable` in the caller's task up to its first wait; the rest in a new task.

    Returns a future of its result: done already when it finished without waiting (with its
    result, or the exception it raised), else the task that finishes it.
    """
    steps = awaitable.__await__()
    try:
        waiting = steps.send(None)
    except StopIteration as done:
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        future.set_result(done.value)
        return future
    except Exception as err:
        failed: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        failed.set_exception(err)
        return failed
    return asyncio.ensure_future(_rest(_Resumed(steps, waiting)))


async def _rest(resumed: _Resumed[_T]) -> _T:
    return await resumed


class _Resumed(Awaitable[_T]):
    """Awaiting it goes on with started `steps` from the wait they stopped at."""

    def __init__(self, steps: Generator[Any, None, _T], waiting: object) -> None:
        self._steps = steps
        self._waiting = waiting

    def __await__(self) -> Generator[Any, None, _T]:
        return stepped(self._steps.send, self._steps.throw, self._waiting)


async def in_own_context(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Await `coroutine` in this task, each of its steps in one copy of the current context.

    As with a task of its own awaited in a `asyncio.TaskGroup`, a cancellation of this task
    delivered meanwhile is not lost when the coroutine swallows it and returns: it is raised
    here. (Code that cancels the task it runs in cancels the caller's: run only coroutines
    that do not.)
    """
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    context = contextvars.copy_context()
    context.run(OWN_CONTEXT.set, object())
    result = await _InContext(coroutine, context)
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result


class _InContext(Awaitable[_T]):
    def __init__(self, coroutine: Coroutine[Any, Any, _T], context: contextvars.Context) -> None:
        self._coroutine = coroutine
        self._context = context

    def __await__(self) -> Generator[Any, None, _T]:
        run, send, throw = self._context.run, self._coroutine.send, self._coroutine.throw
        return stepped(lambda value: run(send, value), lambda error: run(throw, error))


def stepped(
    send: Callable[[Any], Any],
    throw: Callable[[BaseException], Any],
    waiting: object = _NOT_STARTED,
) -> Generator[Any, None, _T]:
    """What an ``__await__`` returns to step a coroutine through `send` and `throw`.

    For awaitables that go on with a coroutine, or wrap each of its steps (`start_eagerly`'s
    rest, `in_own_context`'s context, a step batch): every value the awaiting task sends in
    goes to `send`, every exception thrown in (cancellation included: the coroutine handles
    it) to `throw`, until the coroutine returns. `waiting`: what a coroutine started elsewhere
    waits on now (else it is started with ``send(None)``).
    """
    try:
        if waiting is _NOT_STARTED:
            waiting = send(None)
        while True:
            try:
                value = yield waiting
            except BaseException as err:
                waiting = throw(err)
            else:
                waiting = send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def finished(*futures: asyncio.Future[Any]) -> asyncio.CancelledError | None:
    """Wait until every one of `futures` is done; return the caller's cancellation, if one came.

    A cancellation of the caller meanwhile is held, not raised (the caller raises it when its
    own work is done): `asyncio.wait` never cancels what it waits for, and raises only for
    the caller, so the futures go on to their end.
    """
    interrupted: asyncio.CancelledError | None = None
    while not all(future.done() for future in futures):
        try:
            await asyncio.wait(futures)
        except asyncio.CancelledError as err:
            interrupted = err
    return interrupted


async def to_the_end(future: asyncio.Future[_T]) -> _T:
    """Await `future` (a started write) to its end even when the caller is cancelled meanwhile.

    A cancellation that arrives while it runs is held until it is done, then re-raised (its
    result or failure then goes unseen: the caller is being cancelled). Writes are started in
    the caller's task (`start_eagerly`): a new task would wait for the loop's next turn.
    """
    interrupted = await finished(future)
    if interrupted is not None:
        if not future.cancelled():
            future.exception()  # seen: no "exception was never retrieved" log
        raise interrupted
    return future.result()
