"""A recorded session as the lab replays it: `RecordedSession`, its `RecordedStep` list, loaders.

A **step** is one model call of the agent: the k-th assistant unit of the history (its text,
thinking and tool calls, with their results) answers the k-th prompt. The prompt of step k was
built from every history entry before that unit, and from the environment as it stood then.
So a session replays from:

- its full history (the stored one, when the run never pruned it; otherwise rebuilt from the
  events: the task of each `RunStarted`, the streamed text of each model call, each tool call
  and its result or failure; the loop's own notes, such as re-prompts, are not in events and
  are then missing, which `RecordedSession.notes` says);
- the environment at each step: the stored (last) environment, rolled back through its change
  log (`agent_flow.lab._rollback`) to the version it had when the step's model answered
  (`ModelResponded` events mark the steps, `EnvironmentUpdated` events the versions);
- the usage the steps recorded (completion tokens, to price a candidate's prompts) and the
  tokens the tool schemas cost (the `ContextBuilt` breakdown), since the schemas themselves
  are not stored.

Loaders: `session_from_state` (a loaded `SessionState` and its events), `load_export` (a
JSON-lines file written by `SessionStore.export`) and `load_session` (a store, by id).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from agent_flow.environment import Environment
from agent_flow.errors import EnvironmentValidationError, ExportFormatError, UserError
from agent_flow.events import (
    AgentEvent,
    ContextBuilt,
    EnvironmentUpdated,
    HistoryPruned,
    IterationStarted,
    ModelOutputDiscarded,
    ModelResponded,
    RunFinished,
    RunStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
)
from agent_flow.history import (
    AgentMessage,
    AgentThinking,
    HistoryEntry,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
    build_units,
)
from agent_flow.lab._rollback import environment_at
from agent_flow.messages import ToolCall
from agent_flow.sessions.export import (
    EXPORT_LINE_ADAPTER,
    EntryLine,
    EnvironmentLine,
    EventLine,
    SessionHeaderLine,
    read_export_lines,
)
from agent_flow.sessions.models import SessionInfo, SessionState
from agent_flow.sessions.protocol import SessionStore
from agent_flow.tokens import ApproxCounter

__all__ = [
    "RecordedSession",
    "RecordedStep",
    "load_export",
    "load_session",
    "session_from_state",
]


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One model call of a recorded session.

    Attributes:
        index: 1-based.
        history_length: How many entries of `RecordedSession.entries` preceded the call.
        environment: The environment the prompt was built from (None: the session had none).
        completion_tokens: The answer's tokens as recorded (0 when no usage was recorded).
        recorded_tokens: The prompt's tokens as agent_flow counted them when it was sent (its
            `ContextBuilt` breakdown), if recorded.
    """

    index: int
    history_length: int
    environment: Environment | None
    completion_tokens: int = 0
    recorded_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RecordedSession:
    """A session ready to replay (see the module doc).

    Attributes:
        id: The session id (or a label for a session built in code).
        title: Its title.
        entries: The full history, in order, as the run added it.
        steps: Its model calls, in order.
        model: The model that played it (prices the candidates), if known.
        base_url: The endpoint it was played at, if known.
        final_answer: The last run's final text, if recorded.
        tool_tokens: What the offered tool schemas cost per prompt, as recorded.
        source: ``"history"`` (the stored history is whole) or ``"events"`` (rebuilt).
        notes: What the replay cannot know exactly, in one sentence each.
        delegated: The session's delegated child runs (`agent_flow.Delegate`), each a session
            of its own to replay: its id is ``<session id>/<child run id>``, its history is
            rebuilt from its events, and its steps have no environment (a child's projected
            Environment is not stored).
    """

    id: str
    title: str
    entries: tuple[HistoryEntry, ...]
    steps: tuple[RecordedStep, ...]
    model: str | None = None
    base_url: str | None = None
    final_answer: str | None = None
    tool_tokens: int = 0
    source: str = "history"
    notes: tuple[str, ...] = field(default=())
    delegated: tuple[RecordedSession, ...] = field(default=())

    @classmethod
    def from_entries(
        cls,
        entries: Sequence[HistoryEntry],
        *,
        id: str = "session",
        environment: Environment | None = None,
        model: str | None = None,
        tool_tokens: int = 0,
    ) -> RecordedSession:
        """A session built in code: one step per assistant unit, all with `environment`.

        Raises:
            UserError: The entries break the history's unit rules.
        """
        entries = tuple(entries)
        steps = tuple(
            RecordedStep(index=k, history_length=start, environment=environment)
            for k, start in enumerate(_assistant_starts(entries), 1)
        )
        title = next((e.content for e in entries if isinstance(e, UserMessage)), id)
        return cls(
            id=id,
            title=" ".join(title.split())[:80],
            entries=entries,
            steps=steps,
            model=model,
            tool_tokens=tool_tokens,
        )


def _assistant_starts(entries: Sequence[HistoryEntry]) -> list[int]:
    """The index of the first entry of each assistant unit."""
    starts: list[int] = []
    position = 0
    for unit in build_units(entries, ApproxCounter()):
        if unit.kind == "assistant":
            starts.append(position)
        position += len(unit.entries)
    return starts


def _was_pruned(entries: Sequence[HistoryEntry], events: Sequence[AgentEvent]) -> bool:
    return any(isinstance(e, HistoryPruned) for e in events) or any(
        isinstance(e, Summary) or (isinstance(e, ToolResultEntry) and e.elided_tokens is not None)
        for e in entries
    )


def _entries_from_events(events: Sequence[AgentEvent]) -> list[HistoryEntry]:
    """Rebuild the history a run added from its events (see the module doc)."""
    entries: list[HistoryEntry] = []
    text: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCallEntry] = []
    results: list[ToolResultEntry] = []

    def flush() -> None:
        if thinking:
            entries.append(AgentThinking(content="".join(thinking)))
        if text:
            entries.append(AgentMessage(content="".join(text)))
        answered = {r.call_id for r in results}
        entries.extend(c for c in calls if c.call_id in answered)
        entries.extend(results)
        for buffer in (text, thinking, calls, results):
            buffer.clear()

    for event in events:
        if isinstance(event, RunStarted):
            flush()
            entries.append(UserMessage(content=event.task))
        elif isinstance(event, IterationStarted | RunFinished):
            flush()
        elif isinstance(event, ModelOutputDiscarded):
            text.clear()
            thinking.clear()
        elif isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ThinkingDelta):
            thinking.append(event.text)
        elif isinstance(event, ToolCallStarted) and event.name:
            call = ToolCall(id=event.call_id, name=event.name, arguments=event.arguments)
            calls.append(ToolCallEntry(call=call))
        elif isinstance(event, ToolCallCompleted | ToolCallFailed):
            if not any(c.call_id == event.call_id for c in calls):
                calls.append(
                    ToolCallEntry(call=ToolCall(id=event.call_id, name=event.name, arguments="{}"))
                )
            failed = isinstance(event, ToolCallFailed)
            content = event.error if isinstance(event, ToolCallFailed) else event.content
            is_error = failed or (isinstance(event, ToolCallCompleted) and event.is_error)
            results.append(
                ToolResultEntry(
                    call_id=event.call_id,
                    tool_name=event.name,
                    content=content,
                    is_error=is_error,
                )
            )
    flush()
    return entries


def _step_versions(events: Sequence[AgentEvent], final_version: int) -> list[int]:
    """The environment version at each agent model call, in order."""
    updates = [e for e in events if isinstance(e, EnvironmentUpdated)]
    version = updates[0].version - len(updates[0].changes) if updates else final_version
    versions: list[int] = []
    for event in events:
        if isinstance(event, EnvironmentUpdated):
            version = event.version
        elif isinstance(event, ModelResponded) and event.source == "agent":
            versions.append(version)
    return versions


def session_from_state(state: SessionState, events: Sequence[AgentEvent]) -> RecordedSession:
    """Prepare a loaded session and its events for replay (see the module doc).

    Raises:
        UserError: The session has no model call to replay.
    """
    info, notes = state.info, []
    # A delegated child's events are stored with the session (``path`` set): the session's
    # own steps are its top-level events; each child replays on its own (`_delegated`).
    everything, events = events, [e for e in events if not e.path]
    entries: tuple[HistoryEntry, ...] = state.entries
    source = "history"
    if _was_pruned(entries, events):
        if not any(isinstance(e, RunStarted) for e in events):
            raise UserError(
                f"session {info.id!r} was pruned while it ran and has no events to rebuild "
                "its full history from; record it with a budget that does not prune, or keep "
                "its events"
            )
        entries, source = tuple(_entries_from_events(events)), "events"
        notes.append(
            "the stored history was pruned during the run: rebuilt from the events (messages "
            "the loop added itself, such as re-prompts, are missing)"
        )
        if not any(isinstance(e, TextDelta) for e in events):
            notes.append(
                "the model's text was not streamed, so it is not in the events: the rebuilt "
                "turns hold only their tool calls"
            )
    starts = _assistant_starts(entries)
    if not starts:
        raise UserError(
            f"session {info.id!r} has no model call to replay; run it first (it has "
            f"{len(entries)} history entries)"
        )
    responses = [e for e in events if isinstance(e, ModelResponded) and e.source == "agent"]
    built = [e for e in events if isinstance(e, ContextBuilt)]
    environment = state.environment
    versions = _step_versions(events, environment.version) if environment is not None else []
    if environment is not None and len(versions) != len(starts):
        notes.append(
            f"{len(starts)} model turns but {len(versions)} recorded model calls: every step "
            "is replayed with the last environment"
        )
        versions = [environment.version] * len(starts)
    steps: list[RecordedStep] = []
    for k, start in enumerate(starts):
        env: Environment | None = None
        if environment is not None:
            env, reached = environment_at(environment, versions[k])
            if not reached and f"step {k + 1}" not in " ".join(notes):
                notes.append(
                    f"step {k + 1}: the change log does not reach back to environment version "
                    f"{versions[k]}; the last environment stands in"
                )
        response = responses[k] if len(responses) == len(starts) else None
        prompt = built[k] if len(built) == len(starts) else None
        steps.append(
            RecordedStep(
                index=k + 1,
                history_length=start,
                environment=env,
                completion_tokens=response.completion_tokens if response else 0,
                recorded_tokens=prompt.breakdown.total if prompt else None,
            )
        )
    runs = [e for e in events if isinstance(e, RunStarted)]
    finished = [e for e in events if isinstance(e, RunFinished)]
    return RecordedSession(
        id=info.id,
        title=info.title,
        entries=entries,
        steps=tuple(steps),
        model=next((r.model for r in reversed(responses) if r.model), None)
        or (runs[-1].model if runs else None),
        base_url=runs[-1].base_url if runs else None,
        final_answer=finished[-1].final_text if finished else None,
        tool_tokens=built[-1].breakdown.tools if built else 0,
        source=source,
        notes=tuple(notes),
        delegated=tuple(_delegated(info.id, everything)),
    )


def _delegated(session_id: str, events: Sequence[AgentEvent]) -> list[RecordedSession]:
    """Each delegated child run among a session's `events`, as a session to replay."""
    children: list[RecordedSession] = []
    for start in events:
        if not (isinstance(start, RunStarted) and start.path):
            continue
        own = [e for e in events if e.run_id == start.run_id]
        entries = tuple(_entries_from_events(own))
        starts = _assistant_starts(entries)
        if not starts:
            continue  # the child made no model call (or its events were not stored)
        responses = [e for e in own if isinstance(e, ModelResponded) and e.source == "agent"]
        built = [e for e in own if isinstance(e, ContextBuilt)]
        notes = [
            f"a run delegated by run {start.path[-1]}: its history is rebuilt from its events, "
            "and its environment (a projection of its parent's) is not stored, so its steps "
            "replay without one"
        ]
        if not any(isinstance(e, TextDelta) for e in own):
            notes.append("the model's text was not streamed: the turns hold only tool calls")
        finished = [e for e in own if isinstance(e, RunFinished)]
        children.append(
            RecordedSession(
                id=f"{session_id}/{start.run_id}",
                title=" ".join(start.task.split())[:80],
                entries=entries,
                steps=tuple(
                    RecordedStep(
                        index=k + 1,
                        history_length=first,
                        environment=None,
                        completion_tokens=(
                            responses[k].completion_tokens if len(responses) == len(starts) else 0
                        ),
                        recorded_tokens=(
                            built[k].breakdown.total if len(built) == len(starts) else None
                        ),
                    )
                    for k, first in enumerate(starts)
                ),
                model=next((r.model for r in reversed(responses) if r.model), None) or start.model,
                base_url=start.base_url,
                final_answer=finished[-1].final_text if finished else None,
                tool_tokens=built[-1].breakdown.tools if built else 0,
                source="events",
                notes=tuple(notes),
            )
        )
    return children


def load_export(path: str | Path) -> RecordedSession:
    """Read a JSON-lines export (`SessionStore.export`) and prepare it for replay.

    Raises:
        ExportFormatError: The file cannot be read or is not an export.
        UserError: The session has no model call to replay.
    """
    label = repr(str(path))
    lines = read_export_lines(path, label)
    info: SessionInfo | None = None
    entries: list[HistoryEntry] = []
    environment: Environment | None = None
    events: list[AgentEvent] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = EXPORT_LINE_ADAPTER.validate_json(line)
        except ValidationError as err:
            raise ExportFormatError(
                f"line {number} of {label} is not a session export line; give the lab a file "
                "written by `agent-flow sessions export`"
            ) from err
        if isinstance(item, SessionHeaderLine):
            info = item.session
        elif isinstance(item, EntryLine):
            entries.append(item.entry)
        elif isinstance(item, EnvironmentLine):
            try:
                environment = Environment.from_json(json.dumps(item.environment))
            except (UserError, EnvironmentValidationError) as err:
                raise ExportFormatError(f"the environment in {label} is invalid: {err}") from err
        elif isinstance(item, EventLine):
            events.append(item.event)
    if info is None:
        raise ExportFormatError(f"{label} has no session line; it is not a session export")
    return session_from_state(SessionState(info, tuple(entries), environment), events)


async def load_session(store: SessionStore, session_id: str) -> RecordedSession:
    """Load a stored session and its events and prepare them for replay.

    Raises:
        SessionNotFoundError: No session has that id.
        UserError: The session has no model call to replay.
    """
    state = await store.load(session_id)
    events = await store.events(session_id)
    return session_from_state(state, events)
