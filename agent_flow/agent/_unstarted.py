"""The coroutine `AgentExecutor.run` returns: a run cancelled before it starts lets go at once.

`run` (and `send`, `resume`) claims the agent's next run when called and returns the
coroutine that executes it. A coroutine made a task and cancelled before its first step
never runs a line, its ``finally`` blocks included: the run stayed claimed until the next
call noticed (`_Run.lapsed`), and the subscriptions made for it (`AgentExecutor.subscribe`)
waited for the next run to end. `RunCoroutine` sees that case (a ``throw`` or ``close``
before any ``send``) and lets the run go there and then: the agent is free, and each of its
subscriptions ends, with nothing in it, as it would at the end of the run.

Awaited (``await agent.run(...)``), it hands the awaiting task the wrapped coroutine itself,
which has started by the time anything could be thrown into it: nothing is added per step.

Owner: the agent that claimed the run; `on_unstarted` is its, called at most once.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from agent_flow._coroutines import CoroutineWrapper

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run
    from agent_flow.agent.executor import AgentExecutor

__all__ = ["RunCoroutine", "let_go"]

_T = TypeVar("_T")


class RunCoroutine(CoroutineWrapper[_T]):
    """A run's coroutine that calls `on_unstarted` if it is thrown into or closed unstarted."""

    __slots__ = ("_on_unstarted",)

    def __init__(self, coroutine: Coroutine[Any, Any, _T], on_unstarted: Callable[[], None]):
        super().__init__(coroutine)
        self._on_unstarted: Callable[[], None] | None = on_unstarted

    def send(self, value: Any) -> Any:
        self._on_unstarted = None
        return self._coroutine.send(value)

    def throw(self, *args: Any) -> Any:
        self._let_go()
        return self._coroutine.throw(*args)

    def close(self) -> None:
        self._let_go()
        self._coroutine.close()

    def __await__(self) -> Generator[Any, None, _T]:
        self._on_unstarted = None
        return self._coroutine.__await__()

    def _let_go(self) -> None:
        on_unstarted, self._on_unstarted = self._on_unstarted, None
        if on_unstarted is not None:
            on_unstarted()


def let_go(agent: AgentExecutor, run: _Run) -> None:
    """Free `agent` of `run` (claimed, never started) and end the subscriptions made for it."""
    if agent._run is run:
        agent._run = None
        agent._run_ended()
