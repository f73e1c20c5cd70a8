"""Metering model calls made on an agent's behalf outside its own model step.

The agent loop counts its own model calls. Other parts call a model for it too: the
`LLMSummarizer` a summarizing pruning step awaits, deep inside `History.fold`, which knows
nothing about runs. Such a part reports each finished call with `report_model_call`; whoever
runs it (the agent, around pruning) listens with `listen_for_model_calls`, and the report
reaches it through a context variable: no run object has to be threaded through the history
and pruning layers, and a summarizer built by a user is metered like the agent's own.

Without a listener, reports go nowhere: a summarizer used on its own works as before.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, TypeAlias

from agent_flow.llm.base import FinishReason, Usage

__all__ = [
    "ModelCallListener",
    "ModelCallReport",
    "ModelCallSource",
    "listen_for_model_calls",
    "report_model_call",
]

#: Who made a model call: the agent's own step, or the summarizer while pruning.
ModelCallSource: TypeAlias = Literal["agent", "summarizer"]


@dataclass(frozen=True, slots=True)
class ModelCallReport:
    """One finished model call.

    Attributes:
        source: Who made it.
        usage: Its token usage (when the server reported none, the caller's own counts,
            marked ``estimated``).
        finish_reason: Why the model stopped.
        duration_ms: How long the call took.
        model: The model that answered, as the server named it.
        requested_model: The model the call asked for (the caller's client may not be the
            agent's: a summarizer on a cheaper model is priced as that model).
        base_url: The API root the call went to (it picks the provider of a price).
    """

    source: ModelCallSource
    usage: Usage
    finish_reason: FinishReason
    duration_ms: float
    model: str | None = None
    requested_model: str | None = None
    base_url: str | None = None


#: Receives every report made while it listens.
ModelCallListener: TypeAlias = Callable[[ModelCallReport], Awaitable[None]]

_LISTENER: contextvars.ContextVar[ModelCallListener | None] = contextvars.ContextVar(
    "agent_flow_model_call_listener", default=None
)


@contextmanager
def listen_for_model_calls(listener: ModelCallListener) -> Iterator[None]:
    """Send `listener` every model call reported in this context (and tasks it starts).

    Args:
        listener: Awaited with each `ModelCallReport`, in the reporting task.
    """
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


async def report_model_call(report: ModelCallReport) -> None:
    """Tell the current listener about a finished model call (nothing, without one)."""
    listener = _LISTENER.get()
    if listener is not None:
        await listener(report)
