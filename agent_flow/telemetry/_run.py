"""One recorded run's state, and the spans it made current.

`RunSpans` holds what the tracer keeps between a run's events: its open spans, the model call
in flight, the tools offered. `attach` makes a span current in the calling context; `detach`
undoes it together with whatever that context attached after it (innermost first), and only
in the context that attached it: a context is never reset from another (OpenTelemetry would
log an error, and that context would be corrupted), and a task that ended took its context
with it. A context is its task's, or the copy a turn's only tool call runs in
(`agent_flow._eager.in_own_context`), which ends with the call.
"""

from __future__ import annotations

import asyncio
from contextvars import Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.trace import set_span_in_context

from agent_flow._eager import OWN_CONTEXT

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from agent_flow.llm.observers import ModelCallObserver
    from agent_flow.messages import ToolDefinition
    from agent_flow.prompt import PromptBreakdown
    from agent_flow.telemetry._metrics import CallAttributes

__all__ = ["Place", "RunSpans", "attach", "current_place", "detach"]

#: Where code runs: its task (None outside one: a hook called by hand), and the marker of the
#: `in_own_context` copy it runs in (None: its task's own context).
Place = tuple["asyncio.Task[Any] | None", object | None]


def current_place() -> Place:
    """The context running now (see `Place`)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task, OWN_CONTEXT.get()


@dataclass(eq=False)
class RunSpans:
    """One run's open spans, and the model call in flight."""

    span: Span
    model: str
    # Attributes every span and metric point of the run's model calls starts with.
    common: dict[str, Any]
    # The run's span as a parent, and the attributes every chat span starts with.
    parent: Context | None
    chat_attributes: dict[str, Any]
    # The client's own defaults, which a request that sets none is sent with.
    client_max_tokens: int | None
    client_temperature: float | None
    # Each answering model's metric attributes, built once per run.
    call_attributes: dict[str | None, CallAttributes] = field(default_factory=dict)
    # The prompt built for the next call: its breakdown, and that as attributes.
    breakdown: PromptBreakdown | None = None
    prompt_attributes: dict[str, Any] = field(default_factory=dict)
    chat: Span | None = None
    # What the observer saw of the answer, set on the chat span when the call is counted.
    answered: dict[str, Any] = field(default_factory=dict)
    # The model call in flight: when it started (perf_counter), the seconds to its first
    # chunk (streamed answers), its attempts.
    call_started: float | None = None
    first_chunk: float | None = None
    attempts: int = 1
    # The tools the last request offered, their descriptions by name, and the MCP servers
    # of the agent's MCP tools (read again when a server's list changes).
    offered: tuple[ToolDefinition, ...] = ()
    descriptions: dict[str, str] = field(default_factory=dict)
    mcp_servers: dict[str, str] = field(default_factory=dict)
    tools: dict[str, Span] = field(default_factory=dict)
    fatal_error: str | None = None
    iteration: int = 0
    # False when no SDK records spans (the API's no-op tracer): only metrics are kept.
    recording: bool = True
    # The contexts made current, innermost last: (what, where, the token).
    current: list[tuple[str, Place, Token[Context]]] = field(default_factory=list)
    # The tracer installed as a model-call observer, in the run's task.
    observing: tuple[Place, Token[tuple[ModelCallObserver, ...]]] | None = None


def attach(run: RunSpans, what: str, span: Span) -> None:
    """Make `span` current in this context, as `what` (the run, the chat, a tool call's id)."""
    token = otel_context.attach(set_span_in_context(span))
    run.current.append((what, current_place(), token))


def detach(run: RunSpans, what: str) -> None:
    """Stop `what` being current: in this context, with whatever was attached after it."""
    place = current_place()
    for index in range(len(run.current) - 1, -1, -1):
        if run.current[index][0] != what:
            continue
        if run.current[index][1] == place:
            for later in range(len(run.current) - 1, index - 1, -1):
                if run.current[later][1] == place:
                    otel_context.detach(run.current.pop(later)[2])
        else:
            del run.current[index]  # another context has it, and ends with its task or call
        return
