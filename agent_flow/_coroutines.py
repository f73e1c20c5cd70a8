"""`CoroutineWrapper`: a coroutine object that steps another one, for asyncio and for people.

A wrapper that a task steps in place of the coroutine it wraps (``asyncio.create_task``
takes any `collections.abc.Coroutine`) must still look like that coroutine to whoever
inspects the task: its name in the task's ``repr``, its frame for ``Task.get_stack`` (which
reads ``cr_frame``), its running and waiting state. This base class gives all of that from
the wrapped coroutine and steps it unchanged; a subclass overrides what it adds to a step
(`agent_flow.server._batching`, `agent_flow.agent._unstarted`).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["CoroutineWrapper"]

_T = TypeVar("_T")


class CoroutineWrapper(Coroutine[Any, Any, _T]):
    """Steps `coroutine`; every attribute a task or a debugger reads is the wrapped one's."""

    __slots__ = ("__weakref__", "_coroutine")

    def __init__(self, coroutine: Coroutine[Any, Any, _T]) -> None:
        self._coroutine = coroutine

    def send(self, value: Any) -> Any:
        return self._coroutine.send(value)

    def throw(self, *args: Any) -> Any:
        return self._coroutine.throw(*args)

    def close(self) -> None:
        self._coroutine.close()

    def __await__(self) -> Generator[Any, None, _T]:
        return self._coroutine.__await__()

    @property
    def __name__(self) -> str:
        """The wrapped coroutine's qualified name (what ``repr`` of its task shows)."""
        return str(getattr(self._coroutine, "__qualname__", type(self._coroutine).__name__))

    @property
    def cr_code(self) -> Any:
        """The wrapped coroutine's code."""
        return getattr(self._coroutine, "cr_code", None)

    @property
    def cr_running(self) -> bool:
        """Whether the wrapped coroutine is running."""
        return bool(getattr(self._coroutine, "cr_running", False))

    @property
    def cr_suspended(self) -> bool:
        """Whether the wrapped coroutine is suspended (waiting)."""
        return bool(getattr(self._coroutine, "cr_suspended", False))

    @property
    def cr_frame(self) -> Any:
        """The wrapped coroutine's frame (what ``Task.get_stack`` and ``repr`` show)."""
        return getattr(self._coroutine, "cr_frame", None)

    @property
    def cr_await(self) -> Any:
        """What the wrapped coroutine waits on."""
        return getattr(self._coroutine, "cr_await", None)
