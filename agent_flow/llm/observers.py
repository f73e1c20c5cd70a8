"""Watching an agent's model calls as they happen: the request, the first chunk, each retry.

Events tell what a run did; an observer sees what only the call itself holds, while it is
made: the `LLMRequest` as sent (its prompt, tools and limits), when the first chunk of a
streamed answer arrived, why each failed attempt failed, and the whole `Completion`. The
telemetry ring is one (`agent_flow.telemetry`): the chat span gets the request's settings, the
time to the first chunk, one span event per retry and, when contents are recorded, the
messages and tool definitions.

The agent loop reads `MODEL_CALL_OBSERVERS` (a context variable: an observer is installed
around a run, in its task, and reaches the tasks it starts) at each of its own model calls
and tells every observer, in the task making the call::

    call_started → first_chunk (streamed answers) → attempt_failed (each retry) → call_finished

`call_finished` comes only with a completion; a call that fails for good is told by the run's
events (`ExecutionError`). The summarizer's calls, made while pruning, are not observed.
Observers are called synchronously and must be quick and never raise: they run inside the
loop, on its time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from agent_flow.llm.base import Completion, LLMRequest, RetryNotice

__all__ = ["MODEL_CALL_OBSERVERS", "ModelCallObserver", "observe_model_calls"]


class ModelCallObserver(Protocol):
    """Told about each model call an agent makes in the observed context (see the module)."""

    def call_started(self, run_id: str, request: LLMRequest, *, stream: bool) -> None:
        """The call is about to be made with `request` (streamed or not)."""

    def first_chunk(self, run_id: str) -> None:
        """The first chunk of a streamed answer arrived (again after a voided attempt)."""

    def attempt_failed(self, run_id: str, notice: RetryNotice) -> None:
        """An attempt failed and is tried again after ``notice.delay`` seconds."""

    def call_finished(self, run_id: str, completion: Completion) -> None:
        """The call answered with `completion`."""


#: The observers of the model calls made in this context, in the order they were installed.
MODEL_CALL_OBSERVERS: ContextVar[tuple[ModelCallObserver, ...]] = ContextVar(
    "agent_flow_model_call_observers", default=()
)


@contextmanager
def observe_model_calls(observer: ModelCallObserver) -> Iterator[None]:
    """Add `observer` to the model calls agents make in this block (and tasks it starts)."""
    token = MODEL_CALL_OBSERVERS.set((*MODEL_CALL_OBSERVERS.get(), observer))
    try:
        yield
    finally:
        MODEL_CALL_OBSERVERS.reset(token)
