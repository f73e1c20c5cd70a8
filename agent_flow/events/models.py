"""The events themselves: one frozen model per fact a run reports, their union and JSON lines.

Every event is tagged by ``kind`` and stamped with the run id, a sequence number (gap-free per
run, starting at 0), a UTC timestamp and, for a delegated child run's events, the ``path`` of
run ids it was delegated from, so it serializes to one JSON line and back
(`event_to_json`, `event_from_json`).
"""

from __future__ import annotations

import operator
import typing
from datetime import UTC, datetime
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agent_flow._types import JsonValue
from agent_flow.environment import EnvironmentChange, PlanStep
from agent_flow.history import PruneReport
from agent_flow.prompt import PromptBreakdown

__all__ = [
    "EVENT_ADAPTER",
    "EVENT_KINDS",
    "AgentEvent",
    "ApprovalRequired",
    "ApprovalResolved",
    "ContextBuilt",
    "EnvironmentUpdated",
    "EventKind",
    "EventsDropped",
    "ExecutionError",
    "HistoryPruned",
    "IterationStarted",
    "MCPListChanged",
    "ModelOutputDiscarded",
    "ModelResponded",
    "ModelRetrying",
    "PlanUpdated",
    "RunFinished",
    "RunStarted",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallCompleted",
    "ToolCallFailed",
    "ToolCallStarted",
    "WarningRaised",
    "event_from_json",
    "event_to_json",
]


def _now() -> datetime:
    return datetime.now(UTC)


class _Event(BaseModel):
    """Fields every event carries."""

    # JSON has no infinity or NaN: refuse them rather than write a line that cannot be read.
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    run_id: str
    seq: int
    timestamp: datetime = Field(default_factory=_now)
    #: The run ids of the runs this one was delegated from, outermost first: empty for a
    #: top-level run's events, ``(parent,)`` for a child's (`agent_flow.delegation`). Left
    #: out of the JSON when empty, so the lines of top-level runs read as before (asked of
    #: `operator.not_`, a builtin, on every serialization: a lambda is a Python frame each).
    path: tuple[str, ...] = Field(default=(), exclude_if=operator.not_)


class RunStarted(_Event):
    """A run began with this user message, for this agent and model (at `base_url`)."""

    kind: Literal["run_started"] = "run_started"
    task: str
    agent: str
    model: str
    base_url: str | None = None


class IterationStarted(_Event):
    """The loop began iteration `iteration` (1-based)."""

    kind: Literal["iteration_started"] = "iteration_started"
    iteration: int


class ContextBuilt(_Event):
    """A prompt was assembled; `breakdown` says where its tokens went."""

    kind: Literal["context_built"] = "context_built"
    iteration: int
    breakdown: PromptBreakdown


class ThinkingDelta(_Event):
    """The model streamed reasoning text (not part of its answer)."""

    kind: Literal["thinking_delta"] = "thinking_delta"
    text: str


class TextDelta(_Event):
    """The model streamed answer text."""

    kind: Literal["text_delta"] = "text_delta"
    text: str


class ToolCallArgumentsDelta(_Event):
    """The model streamed part of a tool call's arguments."""

    kind: Literal["tool_call_arguments_delta"] = "tool_call_arguments_delta"
    index: int
    call_id: str | None
    name: str | None
    delta: str


class ModelResponded(_Event):
    """A model call finished: its finish reason, token usage and cost.

    ``source`` says who made it: the agent's own step, or the summarizer while pruning the
    history (its tokens count in the run's usage and limits too). ``model`` is the model
    that answered, as the server named it (``None``: not reported); ``cost_usd`` the call's
    price in US dollars (``None``: unknown, see `agent_flow.pricing`). ``estimated``: the
    server reported no usage, so the token counts are agent_flow's own (`Usage.estimated`).
    """

    kind: Literal["model_responded"] = "model_responded"
    iteration: int
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    tool_calls: int
    duration_ms: float
    source: Literal["agent", "summarizer"] = "agent"
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    model: str | None = None
    cost_usd: float | None = None
    estimated: bool = False


class ToolCallStarted(_Event):
    """A tool call began executing."""

    kind: Literal["tool_call_started"] = "tool_call_started"
    call_id: str
    name: str
    arguments: str


class ToolCallCompleted(_Event):
    """A tool call returned a result (`is_error` when the tool reported a failure itself)."""

    kind: Literal["tool_call_completed"] = "tool_call_completed"
    call_id: str
    name: str
    content: str
    is_error: bool = False
    truncated: bool = False
    duration_ms: float


class ToolCallFailed(_Event):
    """A tool call could not produce a result; the model receives `error` as its result.

    Causes: unknown tool, invalid arguments, the tool raised or timed out, or it was denied;
    ``error_kind`` names which (`agent_flow.tools.ErrorKind`).
    """

    kind: Literal["tool_call_failed"] = "tool_call_failed"
    call_id: str
    name: str
    error: str
    duration_ms: float
    error_kind: str | None = None


class EnvironmentUpdated(_Event):
    """The environment changed; `changes` lists every pointer written or deleted."""

    kind: Literal["environment_updated"] = "environment_updated"
    source: str
    version: int
    changes: tuple[EnvironmentChange, ...]


class MCPListChanged(_Event):
    """An MCP server's tools, resources or prompts changed, and the agent now offers the new list.

    Published between steps, after the server's ``notifications/<list>/list_changed``;
    ``added`` and ``removed`` are names (tools are registered as ``<server>_<tool>``) or,
    for resources, URIs and URI templates.
    """

    kind: Literal["mcp_list_changed"] = "mcp_list_changed"
    server: str
    component: Literal["tools", "resources", "prompts"]
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


class HistoryPruned(_Event):
    """The history was pruned; `report` says what was dropped, elided or summarized."""

    kind: Literal["history_pruned"] = "history_pruned"
    report: PruneReport


class PlanUpdated(_Event):
    """The plan in ``environment.task`` changed."""

    kind: Literal["plan_updated"] = "plan_updated"
    plan: tuple[PlanStep, ...]
    current_step: str | None


class ApprovalRequired(_Event):
    """A tool call waits for approval."""

    kind: Literal["approval_required"] = "approval_required"
    call_id: str
    name: str
    arguments: str
    reason: str


class ApprovalResolved(_Event):
    """An approval request was answered."""

    kind: Literal["approval_resolved"] = "approval_resolved"
    call_id: str
    name: str
    approved: bool
    reason: str = ""
    decided_by: str = Field(default="", description="Who answered (a server's user name).")


class WarningRaised(_Event):
    """Something went wrong that the run survived (a fallback, a handler error, a retry)."""

    kind: Literal["warning_raised"] = "warning_raised"
    message: str
    source: str = ""


class ExecutionError(_Event):
    """An error occurred; `fatal` when it ends the run."""

    kind: Literal["execution_error"] = "execution_error"
    error_type: str
    message: str
    fatal: bool


class RunFinished(_Event):
    """The run ended: why, with what answer, at what cost."""

    kind: Literal["run_finished"] = "run_finished"
    stop_reason: str
    final_text: str
    output: JsonValue = None
    iterations: int
    prompt_tokens: int
    completion_tokens: int
    duration_ms: float
    cost_usd: float | None = None


class EventsDropped(_Event):
    """This subscriber fell behind and `count` events were dropped here (a lossy policy).

    It comes where the dropped events would have been, and carries the sequence numbers of
    the first and last of them; `seq` is that of the event that follows it. Under
    ``drop_deltas_first`` the kept events between two gaps are delivered between their two
    notices.
    """

    kind: Literal["events_dropped"] = "events_dropped"
    count: int
    first_seq: int
    last_seq: int


class ModelRetrying(_Event):
    """A model call failed and is tried again after `delay` seconds (one event per retry).

    ``attempt`` is the attempt that failed, of at most ``max_attempts``.
    """

    kind: Literal["model_retrying"] = "model_retrying"
    iteration: int
    attempt: int
    max_attempts: int
    delay: float
    reason: str


class ModelOutputDiscarded(_Event):
    """The deltas streamed by an abandoned model attempt are void: drop them.

    Published before the `ModelRetrying` of that attempt; ``text`` is the text that was
    streamed (a consumer joining `TextDelta` texts removes this much).
    """

    kind: Literal["model_output_discarded"] = "model_output_discarded"
    iteration: int
    attempt: int
    text: str


AgentEvent: TypeAlias = Annotated[
    RunStarted
    | IterationStarted
    | ContextBuilt
    | ThinkingDelta
    | TextDelta
    | ToolCallArgumentsDelta
    | ModelResponded
    | ModelRetrying
    | ModelOutputDiscarded
    | ToolCallStarted
    | ToolCallCompleted
    | ToolCallFailed
    | EnvironmentUpdated
    | HistoryPruned
    | MCPListChanged
    | PlanUpdated
    | ApprovalRequired
    | ApprovalResolved
    | WarningRaised
    | ExecutionError
    | RunFinished
    | EventsDropped,
    Field(discriminator="kind"),
]
EVENT_ADAPTER: TypeAdapter[AgentEvent] = TypeAdapter(AgentEvent)
#: Every value of ``kind``.
EVENT_KINDS: frozenset[str] = frozenset(
    member.model_fields["kind"].default
    for member in typing.get_args(typing.get_args(AgentEvent)[0])
)
EventKind: TypeAlias = str


def event_to_json(event: AgentEvent) -> str:
    """Serialize an event to one JSON line (no newline inside)."""
    return event.model_dump_json()


def event_from_json(line: str) -> AgentEvent:
    """Parse an event from the JSON line `event_to_json` wrote."""
    return EVENT_ADAPTER.validate_json(line)
