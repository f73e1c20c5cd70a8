"""What an agent run tells the world: the `AgentEvent` union and the `EventBus` that fans it out.

`models` holds the events (and their JSON lines), `bus` their delivery.

Every event is a frozen pydantic model tagged by ``kind`` and stamped with the run id, a
sequence number (gap-free per run, starting at 0) and a UTC timestamp, so it serializes to
one JSON line and back (`event_to_json`, `event_from_json`).

The `EventBus` gives each subscriber its own bounded queue, consumed with ``async for``.
When a subscriber falls behind, its own policy decides, explicitly:

- ``"wait"``: the publisher waits for room (back-pressure; the agent slows to the reader);
  with ``max_wait`` it waits for a reader that fell behind at most that many seconds, then
  drops as below until the reader has caught up (the server bounds every HTTP watcher so);
- ``"drop_oldest"``: the oldest queued events are dropped and the subscriber later receives
  one `EventsDropped` event counting them, so a gap is never silent;
- ``"drop_deltas_first"`` (the default when a subscriber asks for a ``maxsize``): the oldest
  queued *delta* is dropped (`DELTA_KINDS`: ``text_delta``, ``thinking_delta``,
  ``tool_call_arguments_delta``), so lifecycle events (``tool_call_completed``,
  ``environment_updated``, ``run_finished``, ...) are kept as long as any delta is queued;
  only a queue full of lifecycle events drops its oldest one. Each run of dropped events
  becomes one `EventsDropped` in its place, between the kept events around it.

A subscriber that raises or stops reading affects nobody else: it only ever touches its own
queue, and it leaves the bus when the task reading it fails, when it leaves an ``async for``
early and drops the subscription, or at once with ``async with`` / `Subscription.aclose`.

A bus is closed only by whoever created it (`EventBus.close` ends every subscription; queued
events can still be read). An agent that made its own bus closes it when each run ends; a bus
given to agents is shared and no agent closes it, so one finishing never ends another's
subscribers. On a shared bus, ``bus.subscribe()`` sees every agent's events (told apart by
``run_id``) until the creator closes the bus; ``agent.subscribe()`` sees that agent's events
only and ends with its run, as on a bus of its own.
"""

from __future__ import annotations

from agent_flow.events.bus import (
    DELTA_KINDS,
    BackpressurePolicy,
    EventBus,
    EventHook,
    Subscription,
)
from agent_flow.events.models import (
    EVENT_ADAPTER,
    EVENT_KINDS,
    AgentEvent,
    ApprovalRequired,
    ApprovalResolved,
    ContextBuilt,
    EnvironmentUpdated,
    EventKind,
    EventsDropped,
    ExecutionError,
    HistoryPruned,
    IterationStarted,
    MCPListChanged,
    ModelOutputDiscarded,
    ModelResponded,
    ModelRetrying,
    PlanUpdated,
    RunFinished,
    RunStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    WarningRaised,
    event_from_json,
    event_to_json,
)

__all__ = [
    "DELTA_KINDS",
    "EVENT_ADAPTER",
    "EVENT_KINDS",
    "AgentEvent",
    "ApprovalRequired",
    "ApprovalResolved",
    "BackpressurePolicy",
    "ContextBuilt",
    "EnvironmentUpdated",
    "EventBus",
    "EventHook",
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
    "Subscription",
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
