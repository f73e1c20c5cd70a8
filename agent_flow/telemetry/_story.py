"""The budget story as span events: why the model saw what it saw.

Plain functions, one per event kind, each adding one ``agent_flow.*`` event to a span at the
event's own time: the history pruned (what, by how much, whether it fits), the environment
updated (which pointers, by which tool), the plan changed, a warning, an approval asked and
answered. Words that may repeat contents (a plan step, a warning, an approval's reason) are
added only with ``capture``; counts, names and pointers always.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent_flow.telemetry import _names as n

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from agent_flow.events import (
        ApprovalRequired,
        ApprovalResolved,
        EnvironmentUpdated,
        HistoryPruned,
        PlanUpdated,
        WarningRaised,
    )

__all__ = [
    "approval_required",
    "approval_resolved",
    "environment_updated",
    "history_pruned",
    "ns",
    "plan_updated",
    "warning_raised",
]


def ns(at: datetime) -> int:
    """An event's time as a span's (nanoseconds since the epoch)."""
    return int(at.timestamp() * 1_000_000_000)


def approval_required(span: Span, event: ApprovalRequired, *, capture: bool) -> None:
    attributes: dict[str, Any] = {}
    if capture:
        attributes["agent_flow.approval.reason"] = event.reason
    span.add_event(n.APPROVAL_REQUIRED, attributes, timestamp=ns(event.timestamp))


def approval_resolved(span: Span, event: ApprovalResolved) -> None:
    span.add_event(
        n.APPROVAL_RESOLVED,
        {"agent_flow.approval.approved": event.approved},
        timestamp=ns(event.timestamp),
    )


def environment_updated(span: Span, event: EnvironmentUpdated) -> None:
    span.add_event(
        n.ENVIRONMENT_UPDATED,
        {
            "agent_flow.environment.source": event.source,
            "agent_flow.environment.version": event.version,
            "agent_flow.environment.pointers": [c.pointer for c in event.changes],
            "agent_flow.environment.ops": [c.op for c in event.changes],
        },
        timestamp=ns(event.timestamp),
    )


def plan_updated(span: Span, event: PlanUpdated, *, capture: bool) -> None:
    attributes: dict[str, Any] = {"agent_flow.plan.steps": len(event.plan)}
    if capture:
        attributes["agent_flow.plan.current_step"] = event.current_step or ""
    span.add_event(n.PLAN_UPDATED, attributes, timestamp=ns(event.timestamp))


def warning_raised(span: Span, event: WarningRaised, *, capture: bool) -> None:
    attributes = {"agent_flow.warning.source": event.source}
    if capture:
        attributes["message"] = event.message
    span.add_event(n.WARNING, attributes, timestamp=ns(event.timestamp))


def history_pruned(span: Span, event: HistoryPruned) -> None:
    report = event.report
    span.add_event(
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
        timestamp=ns(event.timestamp),
    )
