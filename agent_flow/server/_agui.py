"""The AG-UI endpoint's event stream: a run's agent events as AG-UI events.

A run on an AG-UI thread is a run of the session whose id is the thread id (created on first
use; `agent_flow.server._agui_route`). The stream opens with ``RUN_STARTED`` and a
``STATE_SNAPSHOT`` of the environment (`agent_flow.server._agui_state`), then maps the agent's
events by `MAPPING`: each kind that has an AG-UI counterpart becomes that, and only the kinds
that have none (`UNMAPPED`) are sent as ``CUSTOM`` events named by their kind. So an event is
never told twice: a tool call's arguments come once, whole, in ``TOOL_CALL_ARGS`` when the call
starts (the model's argument deltas are not repeated), and the plan reaches the client as the
``STATE_DELTA`` of ``/task/plan``.

A delegated child's events (``path`` starting with the run; `agent_flow.Delegate`) are not
the run's own: the lifecycle ones (`DELEGATED_KINDS`) go as ``CUSTOM`` events named
``delegated`` whose value is the event's JSON, ``path`` included; their text, deltas and
prompt breakdowns stay out of the stream. A child's ``approval_required`` among them is
answered on the session's approvals route (``POST /sessions/{id}/approvals/{call_id}``): the
in-band ``approve_tool_call`` covers the run's own calls.

A run that hands calls to the client (`StopReason.DEFERRED`) ends with ``RUN_FINISHED`` whose
outcome lists them (``pendingToolCallIds``): a front-end tool's call under its own id, and,
for a client that answers approvals itself, a call of ``approve_tool_call`` under
``approval:<call id>`` for each call waiting for approval. The client answers with tool
messages in its next run input (`agent_flow.server._agui_input`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    EventType,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder
from pydantic import Field

from agent_flow.environment import Environment
from agent_flow.events import (
    AgentEvent,
    ApprovalRequired,
    EnvironmentUpdated,
    IterationStarted,
    RunFinished,
    Subscription,
    TextDelta,
    ThinkingDelta,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
)
from agent_flow.server._agui_input import APPROVAL_PREFIX, APPROVAL_TOOL
from agent_flow.server._agui_state import StateReplica
from agent_flow.server._live import BATCH
from agent_flow.server.models import SESSION_ID_PATTERN

__all__ = ["EMITTED", "MAPPING", "UNMAPPED", "AgUiInput", "AgUiRun"]


class AgUiInput(RunAgentInput):
    """`RunAgentInput` whose thread id is a session id (the OpenAPI document says so too)."""

    thread_id: str = Field(pattern=SESSION_ID_PATTERN, max_length=128)
    """The conversation this run belongs to: the id of its session."""


#: Each agent event kind with an AG-UI counterpart, and what it becomes.
MAPPING: dict[str, str] = {
    "run_started": "RUN_STARTED (the stream's first event)",
    "iteration_started": "STEP_STARTED (and STEP_FINISHED before the next one or the end)",
    "text_delta": "TEXT_MESSAGE_START, TEXT_MESSAGE_CONTENT, TEXT_MESSAGE_END",
    "thinking_delta": "REASONING_START, REASONING_MESSAGE_START/CONTENT/END, REASONING_END",
    "tool_call_arguments_delta": "nothing: the arguments come whole in TOOL_CALL_ARGS",
    "tool_call_started": "TOOL_CALL_START, TOOL_CALL_ARGS, TOOL_CALL_END",
    "tool_call_completed": "TOOL_CALL_RESULT (none for a result the client sent)",
    "tool_call_failed": "TOOL_CALL_RESULT (the error the model reads)",
    "environment_updated": "STATE_DELTA (or STATE_SNAPSHOT)",
    "plan_updated": "nothing: the plan is /task/plan, in STATE_DELTA",
    "approval_required": (
        "a call of approve_tool_call, for a client that declares it; CUSTOM otherwise"
    ),
    "run_finished": "RUN_FINISHED, or RUN_ERROR when the run failed",
}
#: The agent event kinds with no AG-UI counterpart: sent as ``CUSTOM`` events of that name.
UNMAPPED = frozenset(
    {
        "context_built",
        "model_responded",
        "model_retrying",
        "model_output_discarded",
        "history_pruned",
        "mcp_list_changed",
        "approval_resolved",
        "warning_raised",
        "execution_error",
        "events_dropped",
    }
)
_QUIET = frozenset({"run_started", "tool_call_arguments_delta", "plan_updated"})
#: A delegated child's event kinds the stream carries (as ``CUSTOM`` ``delegated`` events).
DELEGATED_KINDS = frozenset(
    {
        "run_started",
        "tool_call_started",
        "tool_call_completed",
        "tool_call_failed",
        "approval_required",
        "approval_resolved",
        "warning_raised",
        "execution_error",
        "run_finished",
    }
)


class AgUiRun:
    """Turns one run's agent events into AG-UI events, keeping the client's state in step.

    Args:
        thread_id: The AG-UI thread (the session id).
        run_id: The AG-UI run id the client chose.
        environment: The session's environment (read when it moves).
        results: The calls whose results this run input brings (the client's own: not sent
            back).
        approved: The calls whose approval this run input answers (asked again by the run
            and answered at once: not asked of the client again).
        approvals_in_band: The client answers approvals itself (it declared
            ``approve_tool_call``).
        notices: ``CUSTOM`` events to send right after the opening snapshot.
    """

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        environment: Environment,
        *,
        results: Iterable[str] = (),
        approved: Iterable[str] = (),
        approvals_in_band: bool = False,
        notices: Iterable[CustomEvent] = (),
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.state = StateReplica(environment)
        self.results = frozenset(results)
        self.approved = frozenset(approved)
        self.approvals_in_band = approvals_in_band
        self.notices = list(notices)
        self.encoder = EventEncoder()
        self._message_id: str | None = None
        self._last_text = ""
        self._reasoning_id: str | None = None
        self._step: str | None = None
        # Calls started and not answered in this run, in order: what the client must answer
        # if the run hands them over.
        self._open: dict[str, None] = {}

    def opening(self) -> list[BaseEvent]:
        """``RUN_STARTED``, the ``STATE_SNAPSHOT`` the deltas apply to, and the notices."""
        return [
            RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id),
            self.state.snapshot(),
            *self.notices,
        ]

    def translate(self, event: AgentEvent) -> list[BaseEvent]:
        """The AG-UI events for one agent event (`MAPPING`; the rest as ``CUSTOM``)."""
        if isinstance(event, TextDelta):
            return self._text(event.text)
        if isinstance(event, ThinkingDelta):
            return self._reasoning(event.text)
        if event.kind in _QUIET:
            return []
        out = self._close_message() + self._close_reasoning()
        if isinstance(event, EnvironmentUpdated):
            out += self.state.events()
        elif isinstance(event, IterationStarted):
            out += self._close_step()
            self._step = f"iteration {event.iteration}"
            out.append(StepStartedEvent(step_name=self._step))
        elif isinstance(event, ToolCallStarted):
            out += _tool_call(event.call_id, event.name, event.arguments)
            self._open[event.call_id] = None
        elif isinstance(event, ToolCallCompleted | ToolCallFailed):
            self._open.pop(event.call_id, None)
            if event.call_id not in self.results:
                content = event.content if isinstance(event, ToolCallCompleted) else event.error
                out.append(
                    ToolCallResultEvent(
                        message_id=uuid.uuid4().hex,
                        tool_call_id=event.call_id,
                        content=content,
                        role="tool",
                    )
                )
        elif isinstance(event, ApprovalRequired) and self.approvals_in_band:
            if event.call_id not in self.approved:  # else asked again, answered at once
                out += self._approval(event)
        elif isinstance(event, RunFinished):
            out += self._finished(event)
        else:
            out.append(CustomEvent(name=event.kind, value=json.loads(event.model_dump_json())))
        return out

    def _text(self, text: str) -> list[BaseEvent]:
        if not text:
            return []
        out = self._close_reasoning()
        if self._message_id is None:
            self._message_id = uuid.uuid4().hex
            self._last_text = ""
            out.append(TextMessageStartEvent(message_id=self._message_id, role="assistant"))
        self._last_text += text
        out.append(TextMessageContentEvent(message_id=self._message_id, delta=text))
        return out

    def _reasoning(self, text: str) -> list[BaseEvent]:
        if not text:
            return []
        out = self._close_message()
        if self._reasoning_id is None:
            self._reasoning_id = uuid.uuid4().hex
            out += [
                ReasoningStartEvent(message_id=self._reasoning_id),
                ReasoningMessageStartEvent(message_id=self._reasoning_id),
            ]
        out.append(ReasoningMessageContentEvent(message_id=self._reasoning_id, delta=text))
        return out

    def _approval(self, event: ApprovalRequired) -> list[BaseEvent]:
        try:
            arguments = json.loads(event.arguments)
        except ValueError:
            arguments = event.arguments
        call_id = APPROVAL_PREFIX + event.call_id
        self._open[call_id] = None
        payload = {
            "call_id": event.call_id,
            "tool_name": event.name,
            "arguments": arguments,
            "reason": event.reason,
        }
        return _tool_call(call_id, APPROVAL_TOOL, json.dumps(payload, ensure_ascii=False))

    def _finished(self, event: RunFinished) -> list[BaseEvent]:
        out = self._close_step() + self.state.events()
        if event.stop_reason == "error":
            out.append(RunErrorEvent(message=event.final_text or "the run failed", code="error"))
            return out
        if event.final_text and event.final_text != self._last_text:
            # An answer the model did not stream (task_completion's summary, a question).
            out += self._text(event.final_text) + self._close_message()
        result = {
            "stop_reason": event.stop_reason,
            "final_text": event.final_text,
            "output": event.output,
        }
        if event.stop_reason == "deferred":
            outcome: RunFinishedSuccessOutcome | RunFinishedCancelledOutcome | None = (
                RunFinishedSuccessOutcome(pending_tool_call_ids=list(self._open))
            )
        elif event.stop_reason == "cancelled":
            outcome = RunFinishedCancelledOutcome()
        else:
            outcome = None
        out.append(
            RunFinishedEvent(
                thread_id=self.thread_id, run_id=self.run_id, result=result, outcome=outcome
            )
        )
        return out

    def _close_message(self) -> list[BaseEvent]:
        if self._message_id is None:
            return []
        message_id, self._message_id = self._message_id, None
        return [TextMessageEndEvent(message_id=message_id)]

    def _close_reasoning(self) -> list[BaseEvent]:
        if self._reasoning_id is None:
            return []
        message_id, self._reasoning_id = self._reasoning_id, None
        return [
            ReasoningMessageEndEvent(message_id=message_id),
            ReasoningEndEvent(message_id=message_id),
        ]

    def _close_step(self) -> list[BaseEvent]:
        if self._step is None:
            return []
        step, self._step = self._step, None
        return [StepFinishedEvent(step_name=step)]

    async def stream(self, subscription: Subscription, agent_run_id: str) -> AsyncIterator[str]:
        """Encode the run's AG-UI events as SSE frames, until it finishes.

        Whatever is queued when the stream's task gets its turn goes out as one chunk (one
        write), up to `BATCH` of the run's events: a tool call alone is three AG-UI events.
        """
        try:
            yield "".join(self.encoder.encode(opening) for opening in self.opening())
            while (event := await anext(subscription, None)) is not None:
                frames: list[str] = []
                finished = self._encode(event, agent_run_id, frames)
                for _ in range(BATCH - 1):
                    if finished or not subscription.queued:
                        break  # reading on would wait: send what there is first
                    finished = self._encode(await anext(subscription), agent_run_id, frames)
                if frames:
                    yield "".join(frames)
                if finished:
                    return
        finally:
            await subscription.aclose()

    def _encode(self, event: AgentEvent, agent_run_id: str, frames: list[str]) -> bool:
        """Append the frames of `event` to `frames`; whether it ends the run."""
        if event.run_id != agent_run_id:
            if event.path[:1] == (agent_run_id,) and event.kind in DELEGATED_KINDS:
                value = json.loads(event.model_dump_json())
                frames.append(self.encoder.encode(CustomEvent(name="delegated", value=value)))
            return False
        frames.extend(self.encoder.encode(out) for out in self.translate(event))
        return isinstance(event, RunFinished)


def _tool_call(call_id: str, name: str, arguments: str) -> list[BaseEvent]:
    out: list[BaseEvent] = [ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name)]
    if arguments:
        out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=arguments))
    out.append(ToolCallEndEvent(tool_call_id=call_id))
    return out


#: The AG-UI event types this endpoint emits.
EMITTED = frozenset(
    {
        EventType.RUN_STARTED,
        EventType.STATE_SNAPSHOT,
        EventType.STATE_DELTA,
        EventType.STEP_STARTED,
        EventType.STEP_FINISHED,
        EventType.TEXT_MESSAGE_START,
        EventType.TEXT_MESSAGE_CONTENT,
        EventType.TEXT_MESSAGE_END,
        EventType.REASONING_START,
        EventType.REASONING_MESSAGE_START,
        EventType.REASONING_MESSAGE_CONTENT,
        EventType.REASONING_MESSAGE_END,
        EventType.REASONING_END,
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
        EventType.TOOL_CALL_RESULT,
        EventType.CUSTOM,
        EventType.RUN_FINISHED,
        EventType.RUN_ERROR,
    }
)
