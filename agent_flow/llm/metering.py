"""Metering model calls made on an agent's behalf outside its own model step.

The agent loop counts its own model calls. Other parts call a model for it too: the
`LLMSummarizer` a summarizing pruning step awaits, deep inside `History.fold`, which knows
nothing about runs. Such a part asks before each call with `admit_model_call` (what it counted
and what it allows, a `ModelCallPlan`) and reports each finished call with
`report_model_call`; whoever runs it (the agent, around pruning) listens with
`listen_for_model_calls`, and both reach it through a context variable: no run object has to
be threaded through the history and pruning layers, and a summarizer built by a user is
metered, and held to the run's cost limit, like the agent's own calls.

Without a listener, plans are admitted and reports go nowhere: a summarizer used on its own
works as before.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, TypeAlias

from agent_flow.llm.base import FinishReason, Usage

__all__ = [
    "ModelCallGate",
    "ModelCallListener",
    "ModelCallPlan",
    "ModelCallReport",
    "ModelCallSource",
    "admit_model_call",
    "listen_for_model_calls",
    "report_model_call",
]

#: Who made a model call: the agent's own step, or the summarizer while pruning.
ModelCallSource: TypeAlias = Literal["agent", "summarizer"]


@dataclass(frozen=True, slots=True)
class ModelCallPlan:
    """A model call about to be made, as its caller counted it.

    Attributes:
        source: Who is making it.
        prompt_tokens: The prompt as the caller's token counter counts it (tool schemas
            included).
        max_tokens: The output allowance the request sends (its ``max_tokens``).
        requested_model: The model the call asks for (``None``: the agent's).
        base_url: The API root it goes to (``None``: the agent's).
    """

    source: ModelCallSource
    prompt_tokens: int
    max_tokens: int
    requested_model: str | None = None
    base_url: str | None = None


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
        plan: The plan the call was admitted with (`admit_model_call`), if it asked: the
            listener compares what the call cost with what it was expected to cost.
    """

    source: ModelCallSource
    usage: Usage
    finish_reason: FinishReason
    duration_ms: float
    model: str | None = None
    requested_model: str | None = None
    base_url: str | None = None
    plan: ModelCallPlan | None = None


#: Receives every report made while it listens.
ModelCallListener: TypeAlias = Callable[[ModelCallReport], Awaitable[None]]
#: Decides whether a planned call may be made: returns to admit it, raises to refuse it.
ModelCallGate: TypeAlias = Callable[[ModelCallPlan], Awaitable[None]]

_METER: contextvars.ContextVar[tuple[ModelCallListener, ModelCallGate | None] | None] = (
    contextvars.ContextVar("agent_flow_model_call_meter", default=None)
)


@contextmanager
def listen_for_model_calls(
    listener: ModelCallListener, *, gate: ModelCallGate | None = None
) -> Iterator[None]:
    """Send `listener` every model call reported in this context (and tasks it starts).

    Args:
        listener: Awaited with each `ModelCallReport`, in the reporting task.
        gate: Awaited with each `ModelCallPlan` before its call is made; it refuses the call
            by raising (the agent raises `agent_flow.errors.CostLimitError`).
    """
    token = _METER.set((listener, gate))
    try:
        yield
    finally:
        _METER.reset(token)


async def admit_model_call(plan: ModelCallPlan) -> None:
    """Ask the current gate whether the planned call may be made (yes, without one).

    Call it right before the call, and pass the plan in the call's `ModelCallReport`.

    Raises:
        CostLimitError: The call could pass the running agent's ``max_cost_usd``.
        ConfigError: The run has a cost limit and the call's model has no known price.
    """
    meter = _METER.get()
    if meter is not None and meter[1] is not None:
        await meter[1](plan)


async def report_model_call(report: ModelCallReport) -> None:
    """Tell the current listener about a finished model call (nothing, without one)."""
    meter = _METER.get()
    if meter is not None:
        await meter[0](report)
