"""Turning one agent's runs into OpenTelemetry GenAI spans (and metric points).

`_EventTracer` is both an `agent_flow.events.EventBus` hook and a model-call observer
(`agent_flow.llm.observers`). As a hook it runs in the publishing task, in event order, so
every span opens and closes exactly where the loop does, timed by each event's own
timestamp. As an observer it sees, in the task making each model call, what only the call
holds: the request, the first chunk, each failed attempt, the completion.

The tree: one run is an ``invoke_agent`` span; under it each model call is a ``chat`` span
(the summarizer's too, marked as such) carrying its prompt's per-section breakdown and one
``agent_flow.model_call.retry`` event per failed attempt, and each tool call an
``execute_tool`` span (concurrent calls are siblings, as they run). Pruning, environment
updates, plan changes, approvals and warnings are span events under ``agent_flow.*``.

Each span is current while its operation runs, in the task that runs it: the run's in the
run's task, a model call's while it is made, a tool's in the task executing the tool. Spans
that instrumented libraries start meanwhile (the MCP SDK's ``tools/call``, an HTTP client's)
are their children. Contexts are detached in the order they were attached, and only in the
task that attached them (a task that ended took its context with it).

Contents (the task, prompts, answers, tool definitions, arguments and results, and any error,
warning, plan or approval text, which may repeat them) are recorded only with
``capture_content``; without it no span, status or event holds any. Nothing here ever sees an
API key: events and requests do not carry one.
"""

from __future__ import annotations

import time
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
    MCPListChanged,
    ModelResponded,
    PlanUpdated,
    RunFinished,
    RunStarted,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    WarningRaised,
)
from agent_flow.llm.observers import MODEL_CALL_OBSERVERS
from agent_flow.prompt import PromptBreakdown
from agent_flow.telemetry import _names as n
from agent_flow.telemetry import _story as story
from agent_flow.telemetry._content import (
    input_messages,
    output_messages,
    text_message,
    tool_definitions,
)
from agent_flow.telemetry._metrics import CallAttributes
from agent_flow.telemetry._providers import provider_name
from agent_flow.telemetry._run import RunSpans as _RunSpans
from agent_flow.telemetry._run import attach, current_place, detach
from agent_flow.telemetry._story import ns

if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.trace import Span, Tracer

    from agent_flow.agent import AgentExecutor
    from agent_flow.llm.base import Completion, LLMRequest, RetryNotice
    from agent_flow.telemetry._metrics import _Metrics

__all__: list[str] = []

_RUN = "run"
_CHAT = "chat"


class _EventTracer:
    """An event hook and model-call observer recording runs as spans; see the module."""

    def __init__(
        self,
        tracer: Tracer,
        metrics: _Metrics | None,
        *,
        capture_content: bool,
        agent: AgentExecutor,
        agent_id: str | None = None,
    ) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._capture = capture_content
        self._agent = agent
        self._agent_id = agent_id
        self._runs: dict[str, _RunSpans] = {}
        self.enabled = True
        # One dictionary lookup per event rather than a chain of isinstance checks.
        self._handlers: dict[type[AgentEvent], Callable[[_RunSpans, Any], None]] = {
            IterationStarted: self._iteration_started,
            ContextBuilt: self._context_built,
            ModelResponded: self._model_responded,
            MCPListChanged: self._mcp_changed,
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
        if type(event) is RunStarted:
            if self.enabled:
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
                previous, run.breakdown = run.breakdown, event.breakdown
                metrics.prompt(event.breakdown, previous)
            case ModelResponded() if metrics is not None:
                first = self._call_ended(run) if event.source == "agent" else None
                metrics.model_call(event, self._call_attributes(run, event), first)
            case HistoryPruned() if metrics is not None:
                metrics.pruned(event.report)
            case ExecutionError(fatal=True):
                run.fatal_error = event.error_type
                self._call_failed(run, event)
            case RunFinished():
                self._run_finished(run, event)
            case _:
                pass

    # -- the run ---------------------------------------------------------------------------

    def _run_started(self, event: RunStarted) -> None:
        common: dict[str, Any] = {n.PROVIDER_NAME: provider_name(event.base_url)}
        if event.base_url:
            parts = urlsplit(event.base_url)
            if parts.hostname:
                common[n.SERVER_ADDRESS] = parts.hostname
                common[n.SERVER_PORT] = parts.port or (443 if parts.scheme == "https" else 80)
        conversation: dict[str, Any] = {}
        session = self._agent.session_id
        if session:
            conversation[n.CONVERSATION_ID] = session
        attributes: dict[str, Any] = {
            n.OPERATION_NAME: n.INVOKE_AGENT,
            n.AGENT_NAME: event.agent,
            n.REQUEST_MODEL: event.model,
            n.RUN_ID: event.run_id,
            **conversation,
            **common,
        }
        if self._agent_id is not None:
            attributes[n.AGENT_ID] = self._agent_id
        if self._capture:
            attributes[n.INPUT_MESSAGES] = text_message("user", event.task)
        # The current context is the caller's: a run started under a request's span is its
        # child, and a context propagated from another process is honoured the same way.
        span = self._tracer.start_span(
            f"{n.INVOKE_AGENT} {event.agent}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=ns(event.timestamp),
        )
        recording = span.is_recording()
        llm = self._agent.llm
        max_tokens = getattr(llm, "max_tokens", None)
        temperature = getattr(llm, "temperature", None)
        run = self._runs[event.run_id] = _RunSpans(
            span=span,
            model=event.model,
            common=common,
            parent=set_span_in_context(span) if recording else None,
            chat_attributes={
                n.OPERATION_NAME: n.CHAT,
                n.REQUEST_MODEL: event.model,
                **conversation,
                **common,
            },
            client_max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            client_temperature=temperature if isinstance(temperature, int | float) else None,
            mcp_servers=dict(self._agent.mcp_tools),
            recording=recording,
        )
        if recording:
            attach(run, _RUN, span)
        if recording or self._metrics is not None:
            token = MODEL_CALL_OBSERVERS.set((*MODEL_CALL_OBSERVERS.get(), self))
            run.observing = (current_place(), token)

    def _run_finished(self, run: _RunSpans, event: RunFinished) -> None:
        del self._runs[event.run_id]
        if run.call_started is not None:  # the run ended while a model call was under way
            self._call_failed(run, "run_ended", end=ns(event.timestamp))
        if run.recording:
            self._end_run(run, event)
        if run.observing is not None and run.observing[0] == current_place():
            MODEL_CALL_OBSERVERS.reset(run.observing[1])
        if self._metrics is not None:
            self._metrics.operation(
                event.duration_ms,
                {n.OPERATION_NAME: n.INVOKE_AGENT, n.REQUEST_MODEL: run.model, **run.common},
                error=run.fatal_error if event.stop_reason == "error" else None,
            )

    def _end_run(self, run: _RunSpans, event: RunFinished) -> None:
        end = ns(event.timestamp)
        # Tool calls the run left unfinished (it was cancelled, or failed around them).
        for call_id, span in list(run.tools.items()):
            detach(run, call_id)
            span.set_attribute(n.ERROR_TYPE, "run_ended")
            span.set_status(StatusCode.ERROR)
            span.end(end_time=end)
        run.tools.clear()
        detach(run, _RUN)
        run.current.clear()
        attributes: dict[str, Any] = {
            n.INPUT_TOKENS: event.prompt_tokens,
            n.OUTPUT_TOKENS: event.completion_tokens,
            n.STOP_REASON: event.stop_reason,
            n.ITERATIONS: event.iterations,
        }
        if event.cost_usd is not None:
            attributes[n.COST_USD] = event.cost_usd
        if self._capture and event.final_text:
            attributes[n.OUTPUT_MESSAGES] = text_message("assistant", event.final_text, "stop")
        if event.stop_reason == "error":
            attributes[n.ERROR_TYPE] = run.fatal_error or "_OTHER"
            run.span.set_status(StatusCode.ERROR, self._said(event.final_text))
        run.span.set_attributes(attributes)
        run.span.end(end_time=end)

    def _said(self, text: str) -> str | None:
        """A status description: the error's own words, only when contents are recorded."""
        return text[:200] if self._capture else None

    def _error(self, run: _RunSpans, event: ExecutionError) -> None:
        # A failed attempt that is tried again is a retry event of its call (`attempt_failed`).
        if event.fatal:
            run.fatal_error = event.error_type
            self._call_failed(run, event)

    def _iteration_started(self, run: _RunSpans, event: IterationStarted) -> None:
        run.iteration = event.iteration

    # -- model calls: the events -----------------------------------------------------------

    def _context_built(self, run: _RunSpans, event: ContextBuilt) -> None:
        breakdown = event.breakdown
        previous, run.breakdown = run.breakdown, breakdown
        attributes = {key: getattr(breakdown, name) for key, name in _BREAKDOWN_ATTRIBUTES}
        attributes[n.ITERATION] = event.iteration
        run.prompt_attributes = attributes
        if run.recording and (previous is None or _steady(previous) != _steady(breakdown)):
            # What stays from prompt to prompt is said once, on the run's span.
            run.span.set_attributes(
                {key: getattr(breakdown, name) for key, name in _STEADY_BREAKDOWN}
            )
        if self._metrics is not None:
            self._metrics.prompt(breakdown, previous)

    def _chat_span(self, run: _RunSpans, start: int, attributes: dict[str, Any]) -> Span:
        return self._tracer.start_span(
            f"{n.CHAT} {run.model}",
            context=run.parent,
            kind=SpanKind.CLIENT,
            attributes={**run.chat_attributes, **attributes},
            start_time=start,
        )

    def _model_responded(self, run: _RunSpans, event: ModelResponded) -> None:
        end = ns(event.timestamp)
        first: float | None = None
        # With what the observer saw of the answer, in one call to the SDK.
        attributes: dict[str, Any] = run.answered if event.source == "agent" else {}
        if event.source == "agent":
            run.answered = {}
        if event.source == "agent" and run.chat is not None:
            span, run.chat = run.chat, None
            detach(run, _CHAT)
            first = self._call_ended(run)
        else:
            # The summarizer's calls (made while pruning) and calls no observer saw (replayed
            # by a recovered durable run) have no span open: place them by their duration.
            start = end - int(event.duration_ms * 1_000_000)
            prompt = run.prompt_attributes if event.source == "agent" else {}
            span = self._chat_span(run, start, {**prompt, n.ITERATION: event.iteration})
        attributes[n.CALL_SOURCE] = event.source
        attributes[n.INPUT_TOKENS] = event.prompt_tokens
        attributes[n.OUTPUT_TOKENS] = event.completion_tokens
        attributes[n.TOOL_CALLS] = event.tool_calls
        if event.model:
            attributes[n.RESPONSE_MODEL] = event.model
        if event.finish_reason:
            attributes[n.RESPONSE_FINISH_REASONS] = (event.finish_reason,)
        if event.cached_tokens is not None:
            attributes[n.CACHE_READ_TOKENS] = event.cached_tokens
        if event.reasoning_tokens is not None:
            attributes[n.REASONING_TOKENS] = event.reasoning_tokens
        if event.cost_usd is not None:
            attributes[n.COST_USD] = event.cost_usd
        span.set_attributes(attributes)
        span.end(end_time=end)
        if self._metrics is not None:
            self._metrics.model_call(event, self._call_attributes(run, event), first)

    def _call_attributes(self, run: _RunSpans, event: ModelResponded) -> CallAttributes:
        """The attributes of a model call's metric points (built once per answering model)."""
        cached = run.call_attributes.get(event.model)
        if cached is None:
            attributes = {n.OPERATION_NAME: n.CHAT, n.REQUEST_MODEL: run.model, **run.common}
            if event.model:
                attributes[n.RESPONSE_MODEL] = event.model
            cached = run.call_attributes[event.model] = CallAttributes(attributes)
        return cached

    def _call_ended(self, run: _RunSpans) -> float | None:
        """Forget the call in flight; return its seconds to the first chunk (streamed)."""
        first, run.first_chunk, run.call_started, run.attempts = run.first_chunk, None, None, 1
        run.answered = {}
        return first

    def _call_failed(
        self, run: _RunSpans, failure: ExecutionError | str, *, end: int | None = None
    ) -> None:
        """The call in flight failed for good: end its span, and record its duration."""
        if run.call_started is None:
            return  # no model call was under way (it failed before, or was never made)
        if isinstance(failure, ExecutionError):
            error, said, end = failure.error_type, failure.message, ns(failure.timestamp)
        else:
            error, said = failure, ""
        seconds = time.perf_counter() - run.call_started
        answered = run.answered
        self._call_ended(run)
        chat, run.chat = run.chat, None
        if chat is not None:
            detach(run, _CHAT)
            chat.set_attributes({**answered, n.ERROR_TYPE: error})
            chat.set_status(StatusCode.ERROR, self._said(said) if said else None)
            chat.end(end_time=end)
        if self._metrics is not None:
            attributes = {n.OPERATION_NAME: n.CHAT, n.REQUEST_MODEL: run.model, **run.common}
            self._metrics.operation(seconds * 1000, attributes, error=error)

    # -- model calls: the observer (`agent_flow.llm.observers`) -----------------------------

    def call_started(self, run_id: str, request: LLMRequest, *, stream: bool) -> None:
        """Open the call's span (current while it runs) with the request's settings."""
        run = self._runs.get(run_id)
        if run is None:
            return
        run.call_started = time.perf_counter()
        if request.tools is not run.offered:
            run.offered = request.tools
            run.descriptions = {tool.name: tool.description for tool in request.tools}
        if not run.recording:
            return
        attributes = {**run.chat_attributes, **run.prompt_attributes}
        max_tokens = request.max_tokens
        if run.client_max_tokens is not None:
            max_tokens = min(max_tokens or run.client_max_tokens, run.client_max_tokens)
        if max_tokens is not None:
            attributes[n.REQUEST_MAX_TOKENS] = max_tokens
        temperature = request.temperature
        if temperature is None:
            temperature = run.client_temperature
        if temperature is not None:
            attributes[n.REQUEST_TEMPERATURE] = temperature
        if request.top_p is not None:
            attributes[n.REQUEST_TOP_P] = request.top_p
        if request.seed is not None:
            attributes[n.REQUEST_SEED] = request.seed
        if request.stop:
            attributes[n.REQUEST_STOP_SEQUENCES] = request.stop
        if self._capture:
            attributes[n.INPUT_MESSAGES] = input_messages(request.messages)
            if request.tools:
                attributes[n.TOOL_DEFINITIONS] = tool_definitions(request.tools)
        run.chat = self._tracer.start_span(
            f"{n.CHAT} {run.model}",
            context=run.parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=time.time_ns(),
        )
        attach(run, _CHAT, run.chat)

    def first_chunk(self, run_id: str) -> None:
        """Note when the answer began (again after a voided attempt: the answer kept)."""
        run = self._runs.get(run_id)
        if run is not None and run.call_started is not None:
            run.first_chunk = time.perf_counter() - run.call_started

    def attempt_failed(self, run_id: str, notice: RetryNotice) -> None:
        """One event on the call's span per failed attempt: why, and how long it waits."""
        run = self._runs.get(run_id)
        if run is None:
            return
        run.attempts = notice.attempt + 1
        if run.chat is None:
            return
        attributes: dict[str, Any] = {
            n.RETRY_ATTEMPT: notice.attempt,
            n.RETRY_MAX_ATTEMPTS: notice.max_attempts,
            n.RETRY_DELAY: notice.delay,
            n.ERROR_TYPE: notice.error_type or "_OTHER",
        }
        if notice.status_code is not None:
            attributes[n.HTTP_STATUS_CODE] = notice.status_code
        if self._capture:
            attributes[n.RETRY_REASON] = notice.reason
        run.chat.add_event(n.RETRY, attributes)

    def call_finished(self, run_id: str, completion: Completion) -> None:
        """The response's id and timing, and with contents its message, on the call's span."""
        run = self._runs.get(run_id)
        if run is None or run.chat is None:
            return
        attributes = run.answered  # set with the rest when the call is counted
        if completion.response_id:
            attributes[n.RESPONSE_ID] = completion.response_id
        if run.first_chunk is not None:
            attributes[n.TIME_TO_FIRST_CHUNK] = run.first_chunk
        if run.attempts > 1:
            attributes[n.ATTEMPTS] = run.attempts
        if self._capture:
            attributes[n.OUTPUT_MESSAGES] = output_messages(completion)

    # -- tool calls ------------------------------------------------------------------------

    def _mcp_changed(self, run: _RunSpans, event: MCPListChanged) -> None:
        if event.component == "tools":
            run.mcp_servers = dict(self._agent.mcp_tools)

    def _tool_started(self, run: _RunSpans, event: ToolCallStarted) -> None:
        span = self._open_tool(run, event.call_id, event.name, ns(event.timestamp))
        run.tools[event.call_id] = span
        if self._capture:
            span.set_attribute(n.TOOL_CALL_ARGUMENTS, event.arguments)
        # Current in the task running the tool: what the tool calls (an MCP server, an
        # instrumented HTTP client) is traced under it.
        attach(run, event.call_id, span)

    def _open_tool(self, run: _RunSpans, call_id: str, name: str, start: int) -> Span:
        server = run.mcp_servers.get(name)
        attributes: dict[str, Any] = {
            n.OPERATION_NAME: n.EXECUTE_TOOL,
            n.TOOL_NAME: name,
            n.TOOL_CALL_ID: call_id,
            n.ITERATION: run.iteration,
            # The conventions' types: "function" runs in this process; "extension" calls out
            # to an external service on the agent's side, as an MCP server's tool does.
            n.TOOL_TYPE: "extension" if server is not None else "function",
        }
        description = run.descriptions.get(name)
        if description:
            attributes[n.TOOL_DESCRIPTION] = description
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
        span.end(end_time=ns(event.timestamp))

    def _tool_failed(self, run: _RunSpans, event: ToolCallFailed) -> None:
        span = self._tool_ended(run, event, error=event.error_kind or "_OTHER")
        if self._capture:
            span.set_attribute(n.TOOL_CALL_RESULT, event.error)
        span.end(end_time=ns(event.timestamp))

    def _tool_ended(
        self, run: _RunSpans, event: ToolCallCompleted | ToolCallFailed, *, error: str | None
    ) -> Span:
        span = run.tools.pop(event.call_id, None)
        if span is None:
            # Refused before it started (a tool the agent may not use now): a span of its
            # own, so the trace shows every call the model made.
            start = ns(event.timestamp) - int(event.duration_ms * 1_000_000)
            span = self._open_tool(run, event.call_id, event.name, start)
        else:
            detach(run, event.call_id)
        if error is not None:
            span.set_attribute(n.ERROR_TYPE, error)
            said = event.error if isinstance(event, ToolCallFailed) else event.content
            span.set_status(StatusCode.ERROR, self._said(said))
        return span

    def _approval(self, run: _RunSpans, event: ApprovalRequired | ApprovalResolved) -> None:
        span = run.tools.get(event.call_id, run.span)
        if isinstance(event, ApprovalRequired):
            story.approval_required(span, event, capture=self._capture)
        else:
            story.approval_resolved(span, event)

    # -- the budget story ------------------------------------------------------------------

    def _environment_updated(self, run: _RunSpans, event: EnvironmentUpdated) -> None:
        story.environment_updated(run.span, event)

    def _plan_updated(self, run: _RunSpans, event: PlanUpdated) -> None:
        story.plan_updated(run.span, event, capture=self._capture)

    def _warning(self, run: _RunSpans, event: WarningRaised) -> None:
        story.warning_raised(run.span, event, capture=self._capture)

    def _pruned(self, run: _RunSpans, event: HistoryPruned) -> None:
        story.history_pruned(run.span, event)
        if self._metrics is not None:
            self._metrics.pruned(event.report)


# The fields of a prompt's breakdown fixed for a run (the budget, the reserve, the priming),
# on the run's span; the others on each chat span. Each as its attribute.
_STEADY_FIELDS: Final = ("budget", "reserve", "priming")
_STEADY_BREAKDOWN: Final = tuple((f"{n.PROMPT_PREFIX}{name}", name) for name in _STEADY_FIELDS)
_BREAKDOWN_ATTRIBUTES: Final = tuple(
    (f"{n.PROMPT_PREFIX}{name}", name)
    for name in PromptBreakdown.model_fields
    if name not in _STEADY_FIELDS
)


def _steady(breakdown: PromptBreakdown) -> tuple[int, int, int]:
    return breakdown.budget, breakdown.reserve, breakdown.priming
