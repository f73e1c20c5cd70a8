"""One recorded run's state, and the spans it made current.

`RunSpans` holds what the tracer keeps between a run's events: its open spans, the model call
in flight, the tools offered. `attach` makes a span current in the calling task; `detach`
undoes it together with whatever that task attached after it (innermost first), and only in
the task that attached it: a context is never reset from another task (OpenTelemetry would
log an error, and that task's context would be corrupted), and a task that ended took its
context with it.
"""

from __future__ import annotations

import asyncio
from contextvars import Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.trace import set_span_in_context

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from agent_flow.llm.observers import ModelCallObserver
    from agent_flow.messages import ToolDefinition
    from agent_flow.prompt import PromptBreakdown
    from agent_flow.telemetry._metrics import CallAttributes

__all__ = ["RunSpans", "attach", "current_task", "detach"]


def current_task() -> asyncio.Task[Any] | None:
    """The running task (``None`` outside one: a hook called by hand)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


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
    # The contexts made current, innermost last: (what, in which task, the token).
    current: list[tuple[str, asyncio.Task[Any] | None, Token[Context]]] = field(
        default_factory=list
    )
    # The tracer installed as a model-call observer, in the run's task.
    observing: tuple[asyncio.Task[Any] | None, Token[tuple[ModelCallObserver, ...]]] | None = None


def attach(run: RunSpans, what: str, span: Span) -> None:
    """Make `span` current in this task, as `what` (the run, the chat, a tool call's id)."""
    token = otel_context.attach(set_span_in_context(span))
    run.current.append((what, current_task(), token))


def detach(run: RunSpans, what: str) -> None:
    """Stop `what` being current: in this task, with whatever was attached after it."""
    task = current_task()
    for index in range(len(run.current) - 1, -1, -1):
        if run.current[index][0] != what:
            continue
        if run.current[index][1] is task:
            for later in range(len(run.current) - 1, index - 1, -1):
                if run.current[later][1] is task:
                    otel_context.detach(run.current.pop(later)[2])
        else:
            del run.current[index]  # its task has the context, and ends with it
        return
