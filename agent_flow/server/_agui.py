"""The AG-UI endpoint: `RunAgentInput` in, AG-UI events out, the Environment as shared state.

A run on an AG-UI thread is a run of the session whose id is the thread id (created on first
use). The stream opens with ``RUN_STARTED`` and a ``STATE_SNAPSHOT`` of the environment, then
maps the agent's events (text, tool calls and results; the rest as ``CUSTOM`` events named by
their kind) and sends a ``STATE_DELTA`` whenever the environment moved: an RFC 6902 JSON Patch
made from the environment's own change log (`Environment.changes`), checked against a replica
of what the client holds, so applying every delta to the snapshot gives the server's state.
When the change log no longer reaches back far enough, a fresh ``STATE_SNAPSHOT`` is sent.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    EventType,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
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

from agent_flow.environment import Environment, EnvironmentChange
from agent_flow.events import (
    AgentEvent,
    EnvironmentUpdated,
    RunFinished,
    Subscription,
    TextDelta,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
)
from agent_flow.server.models import SESSION_ID_PATTERN

__all__ = ["AgUiInput", "AgUiRun", "user_text"]

_Json = Any


class AgUiInput(RunAgentInput):
    """`RunAgentInput` whose thread id is a session id (the OpenAPI document says so too)."""

    thread_id: str = Field(pattern=SESSION_ID_PATTERN, max_length=128)
    """The conversation this run belongs to: the id of its session."""


def user_text(run_input: RunAgentInput) -> str | None:
    """The text of the last user message of `run_input` (None when there is none)."""
    for message in reversed(run_input.messages):
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, str):
            return content or None
        parts = [getattr(part, "text", "") for part in content]
        text = "".join(part for part in parts if isinstance(part, str))
        return text or None
    return None


def _state(environment: Environment) -> dict[str, _Json]:
    state: dict[str, _Json] = json.loads(environment.to_json())["state"]
    return state


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer.split("/")[1:]]


def _pointer(tokens: list[str]) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


_MISSING = object()


def _lookup(document: _Json, tokens: list[str]) -> _Json:
    node = document
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _MISSING
    return node


def _apply(document: _Json, operation: dict[str, _Json]) -> None:
    """Apply one add/replace/remove to `document` in place (the client's replica)."""
    tokens = _tokens(operation["path"])
    parent = _lookup(document, tokens[:-1])
    last = tokens[-1]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if operation["op"] == "add":
            parent.insert(index, value)
        elif operation["op"] == "replace":
            parent[index] = value
        else:
            del parent[index]
    elif operation["op"] == "remove":
        del parent[last]
    else:
        parent[last] = value


class AgUiRun:
    """Turns one run's agent events into AG-UI events, tracking the client's state replica.

    Args:
        thread_id: The AG-UI thread (the session id).
        run_id: The AG-UI run id the client chose.
        environment: The session's environment (read when it moves).
    """

    def __init__(self, thread_id: str, run_id: str, environment: Environment) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.environment = environment
        self.replica = _state(environment)
        self.version = environment.version
        self._message_id: str | None = None
        self.encoder = EventEncoder()

    def opening(self) -> list[BaseEvent]:
        """``RUN_STARTED`` and the ``STATE_SNAPSHOT`` the deltas apply to."""
        return [
            RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id),
            StateSnapshotEvent(snapshot=copy.deepcopy(self.replica)),
        ]

    def state_events(self) -> list[BaseEvent]:
        """A ``STATE_DELTA`` (or a new snapshot) for what changed since the last one."""
        if self.environment.version == self.version:
            return []
        changes = self.environment.changes(since_version=self.version)
        first_expected = self.version + 1
        self.version = self.environment.version
        # The log was trimmed past what the client has, or the whole state was replaced.
        if (
            not changes
            or changes[0].version != first_expected
            or any(not _tokens(change.pointer) for change in changes)
        ):
            self.replica = _state(self.environment)
            return [StateSnapshotEvent(snapshot=copy.deepcopy(self.replica))]
        operations: list[dict[str, _Json]] = []
        for change in changes:
            patch = self._operations(change)
            if patch is None:
                self.replica = _state(self.environment)
                return [StateSnapshotEvent(snapshot=copy.deepcopy(self.replica))]
            for operation in patch:
                _apply(self.replica, operation)
                operations.append(operation)
        return [StateDeltaEvent(delta=operations)] if operations else []

    def _operations(self, change: EnvironmentChange) -> list[dict[str, _Json]] | None:
        """The patch for one change (None: the replica cannot follow; send a snapshot)."""
        tokens = _tokens(change.pointer)
        if change.op == "delete":
            if _lookup(self.replica, tokens) is _MISSING:
                return []
            return [{"op": "remove", "path": change.pointer}]
        parent = _lookup(self.replica, tokens[:-1])
        if parent is _MISSING:
            # Written under containers the replica lacks: add the highest missing one whole.
            depth = next(
                n for n in range(1, len(tokens)) if _lookup(self.replica, tokens[:n]) is _MISSING
            )
            missing = tokens[:depth]
            value = _lookup(_state(self.environment), missing)
            if value is _MISSING:  # gone again since: nothing to tell
                return []
            return [{"op": "add", "path": _pointer(missing), "value": value}]
        if isinstance(parent, list):
            if not tokens[-1].isdigit():
                return None
            index = int(tokens[-1])
            op = "replace" if index < len(parent) else "add"
            return [{"op": op, "path": change.pointer, "value": change.new}]
        if not isinstance(parent, dict):
            return None
        return [{"op": "add", "path": change.pointer, "value": change.new}]

    def translate(self, event: AgentEvent) -> list[BaseEvent]:
        """The AG-UI events for one agent event (state first when the environment moved)."""
        out: list[BaseEvent] = []
        if isinstance(event, TextDelta):
            if not event.text:
                return out
            if self._message_id is None:
                self._message_id = uuid.uuid4().hex
                out.append(TextMessageStartEvent(message_id=self._message_id, role="assistant"))
            out.append(TextMessageContentEvent(message_id=self._message_id, delta=event.text))
            return out
        out += self._close_message()
        if isinstance(event, EnvironmentUpdated):
            return out + self.state_events()
        if isinstance(event, ToolCallStarted):
            out.append(ToolCallStartEvent(tool_call_id=event.call_id, tool_call_name=event.name))
            if event.arguments:
                out.append(ToolCallArgsEvent(tool_call_id=event.call_id, delta=event.arguments))
            out.append(ToolCallEndEvent(tool_call_id=event.call_id))
        elif isinstance(event, ToolCallCompleted | ToolCallFailed):
            content = event.content if isinstance(event, ToolCallCompleted) else event.error
            out.append(
                ToolCallResultEvent(
                    message_id=uuid.uuid4().hex,
                    tool_call_id=event.call_id,
                    content=content,
                    role="tool",
                )
            )
        elif isinstance(event, RunFinished):
            out += self.state_events()
            if event.stop_reason == "error":
                out.append(
                    RunErrorEvent(message=event.final_text or "the run failed", code="error")
                )
            else:
                out.append(
                    RunFinishedEvent(
                        thread_id=self.thread_id,
                        run_id=self.run_id,
                        result={"stop_reason": event.stop_reason, "final_text": event.final_text},
                    )
                )
        else:
            out.append(CustomEvent(name=event.kind, value=json.loads(event.model_dump_json())))
        return out

    def _close_message(self) -> list[BaseEvent]:
        if self._message_id is None:
            return []
        message_id, self._message_id = self._message_id, None
        return [TextMessageEndEvent(message_id=message_id)]

    async def stream(self, subscription: Subscription, agent_run_id: str) -> AsyncIterator[str]:
        """Encode the run's AG-UI events as SSE frames, until it finishes."""
        try:
            for opening in self.opening():
                yield self.encoder.encode(opening)
            async for event in subscription:
                if event.run_id != agent_run_id:
                    continue
                for out in self.translate(event):
                    yield self.encoder.encode(out)
                if isinstance(event, RunFinished):
                    return
        finally:
            await subscription.aclose()


#: The AG-UI event types this endpoint emits.
EMITTED = frozenset(
    {
        EventType.RUN_STARTED,
        EventType.STATE_SNAPSHOT,
        EventType.STATE_DELTA,
        EventType.TEXT_MESSAGE_START,
        EventType.TEXT_MESSAGE_CONTENT,
        EventType.TEXT_MESSAGE_END,
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
        EventType.TOOL_CALL_RESULT,
        EventType.CUSTOM,
        EventType.RUN_FINISHED,
        EventType.RUN_ERROR,
    }
)
