"""Small helpers shared across agent_flow's modules."""

from __future__ import annotations

import asyncio
import json
import math
import select
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeGuard, TypeVar

from agent_flow._eager import finished

__all__ = ["cancel_and_wait", "compact_json", "conforms", "loads_json", "readable", "weak_method"]

T = TypeVar("T")
G = TypeVar("G")
P = ParamSpec("P")

# (type, protocol) pairs known to conform; bounded, for programs that make classes at runtime.
_CONFORMING: set[tuple[type, type]] = set()
_MAX_CONFORMING = 4096


def conforms(value: object, protocol: type[T]) -> TypeGuard[T]:
    """``isinstance(value, protocol)`` for a runtime-checkable protocol, remembered per type.

    A protocol's isinstance looks up each of its members on every call (tens of µs); the loop
    asks the same question of the same types several times per turn. A type one of whose
    instances had every member is taken to conform from then on (members that only some
    instances set themselves are not told apart). mypy refuses a protocol where ``type[T]``
    is expected (python/mypy#4717): callers silence that one check.
    """
    key = (type(value), protocol)
    if key in _CONFORMING:
        return True
    if not isinstance(value, protocol):
        return False
    if len(_CONFORMING) >= _MAX_CONFORMING:
        _CONFORMING.clear()
    _CONFORMING.add(key)
    return True


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON, but past what a float holds
        raise ValueError(f"{text} is out of a number's range")
    return value


def loads_json(text: str) -> object:
    """Parse JSON as the spec defines it, and as every event line can carry it.

    Python's `NaN` and `Infinity` extensions are refused, and so is a number past a float's
    range (``1e400``, which Python reads as infinity).

    Raises:
        json.JSONDecodeError: The text is not JSON.
        ValueError: The text uses NaN or Infinity, or a number out of range (which no event
            line could carry).
    """
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite)


def compact_json(value: object) -> str:
    """`value` as JSON without spaces, non-ASCII text kept as it is (not escaped)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def readable(fd: int) -> bool:
    """Whether a read on the socket `fd` would return at once, without reading it.

    Data waiting, or the end a closed peer sends: on an idle connection, either means the
    other side has spoken (often its last word). A gone socket (``fd < 0``) counts as readable:
    the next read ends. One ``poll`` system call (``select`` where there is no ``poll``: Windows,
    eventlet); the poll object is not kept, so this is safe from any thread.
    """
    if fd < 0:
        return True
    if not hasattr(select, "poll"):  # Windows, or eventlet's patched select
        return bool(select.select([fd], [], [], 0)[0])
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


def weak_method(method: Callable[P, T], gone: G) -> Callable[P, T | G]:
    """Bound `method`, called through a weak reference to its object; `gone` once it is freed.

    For a part that calls back into the object that owns it (an agent's tool hooks, its MCP
    servers' run id, its recorder's lease-lost callback): a strong bound method would make
    the owner and its parts a reference cycle, which only the cycle collector frees, so
    every agent dropped would wait for a full collection with everything it held.
    """
    ref = weakref.WeakMethod(method)

    def call(*args: P.args, **kwargs: P.kwargs) -> T | G:
        bound = ref()
        return gone if bound is None else bound(*args, **kwargs)

    return call


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel `tasks` and wait until all have finished, never losing the caller's cancellation.

    What ``task.cancel()`` then ``await task`` under ``suppress(CancelledError)`` means to do,
    without its flaw: that suppress also swallows a `CancelledError` meant for the caller (the
    task running this), which then carries on as if it had not been cancelled. Here the
    tasks' own cancellation is swallowed, the caller's never is:

    - A task that ends cancelled, or that ignores the cancel and returns, is done with.
    - A caller cancelled while it waits here (or before, in a cancellation not yet delivered:
      one it asked of itself) still waits until every task has finished, and then gets its
      `CancelledError`. The tasks are not cancelled again: a task that cleans up when
      cancelled (say, in a ``finally``) is let finish its cleanup. A task that never ends
      holds the caller, as in `asyncio.TaskGroup`.
    - A caller whose cancellation was delivered before this call (cleanup in a ``finally`` or
      an ``except CancelledError``, ``cancelling()`` already above zero) waits as anyone
      would and returns: the cleanup after this call runs, and the `CancelledError` under way
      goes on when it ends. Raising here would cut that cleanup short (a lease not released,
      a pipe not closed) and change nothing for the cancellation.
    - A task that failed with another exception (before or while it stopped): the first
      such exception, in the order given, is raised once all have finished, as ``await task``
      raised it (in a ``finally``, as any exception raised there, it replaces the exception
      under way: a call site whose cleanup must go on past it catches it). A failure of any
      later task is left to asyncio's "exception was never retrieved" log.

    Only `asyncio.wait` waits here, which never cancels what it waits for and raises
    `CancelledError` only when the caller itself is cancelled: the two cancellations cannot
    be mistaken for each other, whatever the caller's ``cancelling()`` count was on entry.

    Raises:
        asyncio.CancelledError: The caller was cancelled while it waited (it is raised once
            the tasks have finished; a task's failure, if any, is its ``__context__``).
        Exception: A task's own failure, when the caller was not cancelled.
    """
    for task in tasks:
        task.cancel()
    interrupted = await finished(*tasks)  # ours, not a task's: held until they finish
    failure = next(
        (error for task in tasks if not task.cancelled() and (error := task.exception())),
        None,
    )
    if interrupted is not None:
        if failure is not None:
            interrupted.__context__ = failure
        raise interrupted
    if failure is not None:
        raise failure
