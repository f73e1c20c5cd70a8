"""Turning one agent's events into OpenTelemetry GenAI spans (and metric points).

`_EventTracer` is an `agent_flow.events.EventBus` hook: it runs in the publishing task, in
event order, so every span opens and closes exactly where the loop does, and uses each
event's own timestamp as the span's time. One run is an ``invoke_agent`` span; under it, each
model call is a ``chat`` span (the summarizer's included, marked as such) carrying the
prompt's per-section breakdown, and each tool call an ``execute_tool`` span (concurrent calls
are siblings, as they run). Pruning, environment updates, plan changes, approvals and warnings
are span events under ``agent_flow.*``: the trace says why the model saw what it saw.

Message contents (the task, answers, tool arguments and results) are recorded only with
``capture_content``. Nothing here ever sees an API key: events do not carry one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from opentelemetry.trace import SpanKind, StatusCode, set_span_in_context

from agent_flow.events import (
    AgentEvent,
    ApprovalRequired,
    ApprovalResolved,
    ContextBuilt,
    EnvironmentUpdated,
    ExecutionError,
    HistoryPruned,
    IterationStarted,
    ModelResponded,
    PlanUpdated,
    RunFinished,
    RunStarted,
    TextDelta,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    WarningRaised,
)
from agent_flow.prompt import PromptBreakdown
from agent_flow.telemetry import _names as n
from agent_flow.telemetry._metrics import CallAttributes

if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from agent_flow.telemetry._metrics import _Metrics

__all__ = ["provider_name"]

# Hosts whose provider the conventions name; anything else speaking the OpenAI API is "openai"
# compatible but not OpenAI: reported as the conventions' catch-all.
_PROVIDERS = (
    ("openai.azure.com", "azure.ai.openai"),
    ("api.openai.com", "openai"),
    ("anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("api.cohere", "cohere"),
)


def provider_name(base_url: str | None) -> str:
    """The ``gen_ai.provider.name`` of a server: known hosts by name, others ``_OTHER``."""
    host = (urlsplit(base_url).hostname or "") if base_url else ""
    for suffix, name in _PROVIDERS:
        if host.endswith(suffix):
            return name
    return "_OTHER"


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


@dataclass
class _RunSpans:
    """The open spans of one run."""

    span: Span
    model: str
    common: dict[str, Any]
    # The run's span as a parent (built once) and the attributes every chat span starts with.
    parent: Context | None = None
    chat_attributes: dict[str, Any] = field(default_factory=dict)
    # Each answering model's metric attributes, built once per run.
    call_attributes: dict[str | None, CallAttributes] = field(default_factory=dict)
    chat: Span | None = None
    chat_text: list[str] = field(default_factory=list)
    tools: dict[str, Span] = field(default_factory=dict)
    fatal_error: str | None = None
    iteration: int = 0
    # False when no SDK records spans (the API's no-op tracer): only metrics are kept.
    recording: bool = True


class _EventTracer:
    """An event hook recording runs as spans; see the module docstring."""

    def __init__(
        self,
        tracer: Tracer,
        metrics: _Metrics | None,
        *,
        capture_content: bool,
        is_mcp: Callable[[str], str | None],
    ) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._capture = capture_content
        self._is_mcp = is_mcp
        self._runs: dict[str, _RunSpans] = {}
        self.enabled = True
        # One dictionary lookup per event rather than a chain of isinstance checks.
        self._handlers: dict[type[AgentEvent], Callable[[_RunSpans, Any], None]] = {
            IterationStarted: self._iteration_started,
            ContextBuilt: self._context_built,
            TextDelta: self._text_delta,
            ModelResponded: self._model_responded,
            ToolCallStarted: self._tool_started,
            ToolCallCompleted: self._tool_completed,
            ToolCallFailed: self._tool_failed,
            ApprovalRequired: self._approval,
            ApprovalResolved: self._approval,
            EnvironmentUpdated: self._environment_updated,
            HistoryPruned: self._pruned,
            PlanUpdated: self._plan_updated,
            WarningRaised: self._warning,
            ExecutionError: self._error,
            RunFinished: self._run_finished,
        }

    def __call__(self, event: AgentEvent) -> None:
        if not self.enabled:
            return
        if type(event) is RunStarted:
            self._run_started(event)
            return
        run = self._runs.get(event.run_id)
        if run is None:
            return
        if not run.recording:
            self._metrics_only(run, event)
            return
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(run, event)

    def _metrics_only(self, run: _RunSpans, event: AgentEvent) -> None:
        """What a run costs when its spans go nowhere: the metrics, or nothing at all."""
        metrics = self._metrics
        match event:
            case ContextBuilt() if metrics is not None:
                metrics.prompt(event.breakdown)
            case ModelResponded() if metrics is not None:
                metrics.model_call(event, self._call_attributes(run, event))
            case HistoryPruned() if metrics is not None:
                metrics.pruned(event.report)
            case ExecutionError(fatal=True):
                run.fatal_error = event.error_type
            case RunFinished():
                del self._runs[event.run_id]
                self._run_metrics(run, event)
            case _:
                pass

    # -- the run ---------------------------------------------------------------------------

    def _run_started(self, event: RunStarted) -> None:
        common: dict[str, Any] = {n.PROVIDER_NAME: provider_name(event.base_url)}
        if event.base_url:
            parts = urlsplit(event.base_url)
            if parts.hostname:
                common[n.SERVER_ADDRESS] = parts.hostname
            if parts.port:
                common[n.SERVER_PORT] = parts.port
        attributes: dict[str, Any] = {
            n.OPERATION_NAME: n.INVOKE_AGENT,
            n.AGENT_NAME: event.agent,
            n.REQUEST_MODEL: event.model,
            n.CONVERSATION_ID: event.run_id,
            n.RUN_ID: event.run_id,
            **common,
        }
        if self._capture:
            attributes[n.INPUT_MESSAGES] = _messages("user", event.task)
        # The current context is the caller's: a run started under a request's span is its
        # child, and a context propagated from another process is honoured the same way.
        span = self._tracer.start_span(
            f"{n.INVOKE_AGENT} {event.agent}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_ns(event.timestamp),
        )
        recording = span.is_recording()
        self._runs[event.run_id] = _RunSpans(
            span=span,
            model=event.model,
            common=common,
            parent=set_span_in_context(span) if recording else None,
            chat_attributes={n.OPERATION_NAME: n.CHAT, n.REQUEST_MODEL: event.model, **common},
            recording=recording,
        )

    def _run_finished(self, run: _RunSpans, event: RunFinished) -> None:
        end = _ns(event.timestamp)
        for span in [*([run.chat] if run.chat else []), *run.tools.values()]:
            span.set_attribute(n.ERROR_TYPE, "run_ended")
            span.set_status(StatusCode.ERROR, "the run ended before this operation finished")
            span.end(end_time=end)
        attributes: dict[str, Any] = {
            n.INPUT_TOKENS: event.prompt_tokens,
            n.OUTPUT_TOKENS: event.completion_tokens,
            n.STOP_REASON: event.stop_reason,
            n.ITERATIONS: event.iterations,
        }
        if event.cost_usd is not None:
            attributes[n.COST_USD] = event.cost_usd
        if self._capture and event.final_text:
            attributes[n.OUTPUT_MESSAGES] = _messages("assistant", event.final_text)
        if event.stop_reason == "error":
            attributes[n.ERROR_TYPE] = run.fatal_error or "_OTHER"
            run.span.set_status(StatusCode.ERROR, event.final_text[:200])
        run.span.set_attributes(attributes)
        run.span.end(end_time=end)
        del self._runs[event.run_id]
        self._run_metrics(run, event)

    def _run_metrics(self, run: _RunSpans, event: RunFinished) -> None:
        if self._metrics is not None:
            self._metrics.operation(
                event.duration_ms,
                {n.OPERATION_NAME: n.INVOKE_AGENT, n.REQUEST_MODEL: run.model, **run.common},
                error=run.fatal_error if event.stop_reason == "error" else None,
            )

    def _error(self, run: _RunSpans, event: ExecutionError) -> None:
        if event.fatal:
            run.fatal_error = event.error_type
        if run.chat is None:
            return
        # The model call failed: end its span; a retry opens the next one.
        run.chat.set_attribute(n.ERROR_TYPE, event.error_type)
        run.chat.set_status(StatusCode.ERROR, event.message[:200])
        run.chat.end(end_time=_ns(event.timestamp))
        run.chat = None
        if not event.fatal:
            run.chat = self._chat_span(run, _ns(event.timestamp), {n.ITERATION: run.iteration})

    def _iteration_started(self, run: _RunSpans, event: IterationStarted) -> None:
        run.iteration = event.iteration

    # -- model calls -----------------------------------------------------------------------

    def _chat_span(self, run: _RunSpans, start: int, attributes: dict[str, Any]) -> Span:
        return self._tracer.start_span(
            f"{n.CHAT} {run.model}",
            context=run.parent,
            kind=SpanKind.CLIENT,
            attributes={**run.chat_attributes, **attributes},
            start_time=start,
        )

    def _context_built(self, run: _RunSpans, event: ContextBuilt) -> None:
        breakdown = event.breakdown
        attributes = {key: getattr(breakdown, name) for key, name in _BREAKDOWN_ATTRIBUTES}
        attributes[n.ITERATION] = event.iteration
        run.chat_text = []
        run.chat = self._chat_span(run, _ns(event.timestamp), attributes)
        if self._metrics is not None:
            self._metrics.prompt(breakdown)

    def _text_delta(self, run: _RunSpans, event: TextDelta) -> None:
        if self._capture and run.chat is not None:
            run.chat_text.append(event.text)

    def _model_responded(self, run: _RunSpans, event: ModelResponded) -> None:
        end = _ns(event.timestamp)
        if event.source == "agent" and run.chat is not None:
            span, run.chat = run.chat, None
        else:
            # The summarizer's calls (made while pruning) have no span open: place them by
            # their duration.
            start = end - int(event.duration_ms * 1_000_000)
            span = self._chat_span(run, start, {n.ITERATION: event.iteration})
        attributes: dict[str, Any] = {
            n.CALL_SOURCE: event.source,
            n.INPUT_TOKENS: event.prompt_tokens,
            n.OUTPUT_TOKENS: event.completion_tokens,
            n.TOOL_CALLS: event.tool_calls,
        }
        if event.model:
            attributes[n.RESPONSE_MODEL] = event.model
        if event.finish_reason:
            attributes[n.RESPONSE_FINISH_REASONS] = [event.finish_reason]
        if event.cached_tokens is not None:
            attributes[n.CACHE_READ_TOKENS] = event.cached_tokens
        if event.reasoning_tokens is not None:
            attributes[n.REASONING_TOKENS] = event.reasoning_tokens
        if event.cost_usd is not None:
            attributes[n.COST_USD] = event.cost_usd
        if self._capture and event.source == "agent" and run.chat_text:
            attributes[n.OUTPUT_MESSAGES] = _messages(
                "assistant", "".join(run.chat_text), event.finish_reason
            )
        span.set_attributes(attributes)
        span.end(end_time=end)
        if self._metrics is not None:
            self._metrics.model_call(event, self._call_attributes(run, event))

    def _call_attributes(self, run: _RunSpans, event: ModelResponded) -> CallAttributes:
        """The attributes of a model call's metric points (built once per answering model)."""
        cached = run.call_attributes.get(event.model)
        if cached is None:
            attributes = {n.OPERATION_NAME: n.CHAT, n.REQUEST_MODEL: run.model, **run.common}
            if event.model:
                attributes[n.RESPONSE_MODEL] = event.model
            cached = run.call_attributes[event.model] = CallAttributes(attributes)
        return cached

    # -- tool calls ------------------------------------------------------------------------

    def _tool_started(self, run: _RunSpans, event: ToolCallStarted) -> None:
        span = self._open_tool(run, event.call_id, event.name, _ns(event.timestamp))
        run.tools[event.call_id] = span
        if self._capture:
            span.set_attribute(n.TOOL_CALL_ARGUMENTS, event.arguments)

    def _open_tool(self, run: _RunSpans, call_id: str, name: str, start: int) -> Span:
        server = self._is_mcp(name)
        attributes: dict[str, Any] = {
            n.OPERATION_NAME: n.EXECUTE_TOOL,
            n.TOOL_NAME: name,
            n.TOOL_CALL_ID: call_id,
            n.ITERATION: run.iteration,
            # The conventions' types: "function" runs in this process; "extension" calls out
            # to an external service on the agent's side, as an MCP server's tool does.
            n.TOOL_TYPE: "extension" if server is not None else "function",
        }
        if server is not None:
            attributes[n.MCP_TOOL] = True
            attributes[n.MCP_SERVER] = server
        return self._tracer.start_span(
            f"{n.EXECUTE_TOOL} {name}",
            context=run.parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
        )

    def _tool_completed(self, run: _RunSpans, event: ToolCallCompleted) -> None:
        span = self._tool_ended(run, event, error="reported" if event.is_error else None)
        if self._capture:
            span.set_attribute(n.TOOL_CALL_RESULT, event.content)
        del run.tools[event.call_id]
        span.end(end_time=_ns(event.timestamp))

    def _tool_failed(self, run: _RunSpans, event: ToolCallFailed) -> None:
        span = self._tool_ended(run, event, error=event.error_kind or "_OTHER")
        if self._capture:
            span.set_attribute(n.TOOL_CALL_RESULT, event.error)
        del run.tools[event.call_id]
        span.end(end_time=_ns(event.timestamp))

    def _tool_ended(
        self, run: _RunSpans, event: ToolCallCompleted | ToolCallFailed, *, error: str | None
    ) -> Span:
        span = run.tools.get(event.call_id)
        if span is None:
            # Refused before it started (a tool the agent may not use now): a span of its
            # own, so the trace shows every call the model made.
            start = _ns(event.timestamp) - int(event.duration_ms * 1_000_000)
            span = self._open_tool(run, event.call_id, event.name, start)
            run.tools[event.call_id] = span
        if error is not None:
            span.set_attribute(n.ERROR_TYPE, error)
            message = event.error if isinstance(event, ToolCallFailed) else event.content
            span.set_status(StatusCode.ERROR, message[:200])
        return span

    def _approval(self, run: _RunSpans, event: ApprovalRequired | ApprovalResolved) -> None:
        span = run.tools.get(event.call_id, run.span)
        if isinstance(event, ApprovalRequired):
            span.add_event(
                n.APPROVAL_REQUIRED,
                {"agent_flow.approval.reason": event.reason},
                timestamp=_ns(event.timestamp),
            )
        else:
            span.add_event(
                n.APPROVAL_RESOLVED,
                {"agent_flow.approval.approved": event.approved},
                timestamp=_ns(event.timestamp),
            )

    # -- the budget story ------------------------------------------------------------------

    def _environment_updated(self, run: _RunSpans, event: EnvironmentUpdated) -> None:
        run.span.add_event(
            n.ENVIRONMENT_UPDATED,
            {
                "agent_flow.environment.source": event.source,
                "agent_flow.environment.version": event.version,
                "agent_flow.environment.pointers": [c.pointer for c in event.changes],
                "agent_flow.environment.ops": [c.op for c in event.changes],
            },
            timestamp=_ns(event.timestamp),
        )

    def _plan_updated(self, run: _RunSpans, event: PlanUpdated) -> None:
        run.span.add_event(
            n.PLAN_UPDATED,
            {
                "agent_flow.plan.steps": len(event.plan),
                "agent_flow.plan.current_step": event.current_step or "",
            },
            timestamp=_ns(event.timestamp),
        )

    def _warning(self, run: _RunSpans, event: WarningRaised) -> None:
        run.span.add_event(
            n.WARNING,
            {"agent_flow.warning.source": event.source, "message": event.message},
            timestamp=_ns(event.timestamp),
        )

    def _pruned(self, run: _RunSpans, event: HistoryPruned) -> None:
        report = event.report
        run.span.add_event(
            n.HISTORY_PRUNED,
            {
                "agent_flow.prune.strategy": report.strategy,
                "agent_flow.prune.tokens_before": report.tokens_before,
                "agent_flow.prune.tokens_after": report.tokens_after,
                "agent_flow.prune.max_tokens": report.max_tokens,
                "agent_flow.prune.dropped": len(report.dropped),
                "agent_flow.prune.elided": len(report.elided),
                "agent_flow.prune.summarized": len(report.summarized),
                "agent_flow.prune.summary_id": report.summary_id or "",
                "agent_flow.prune.fits": report.fits,
            },
            timestamp=_ns(event.timestamp),
        )
        if self._metrics is not None:
            self._metrics.pruned(report)


# The chat span's attribute for each field of the prompt's breakdown, in its order.
_BREAKDOWN_ATTRIBUTES: Final = tuple(
    (f"{n.PROMPT_PREFIX}{name}", name) for name in PromptBreakdown.model_fields
)


def _messages(role: str, text: str, finish_reason: str | None = None) -> str:
    """One message in the conventions' JSON shape for ``gen_ai.*.messages``."""
    message: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": text}]}
    if finish_reason is not None:
        message["finish_reason"] = finish_reason
    return json.dumps([message])
