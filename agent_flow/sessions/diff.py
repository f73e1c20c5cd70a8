"""Comparing two sessions: their environments pointer by pointer, their prompts step by step.

`diff_sessions` takes two loaded sessions (a `SessionState` and its events, from any store or
an export) and returns a `SessionDiff`:

- ``environment``: every JSON pointer whose value differs between the two final
  environments (`PointerDiff`: added, removed or changed, with both values), found by walking
  both states in step; lists are compared item by item, so an appended fact is one addition;
- ``steps``: one `StepComparison` per prompt the sessions built (the n-th ``context_built``
  event of each, across runs), with each side's `PromptBreakdown`; a delegated child's
  prompts are stored with its parent's session, in the order they were built, and are marked
  by their ``depth``;
- ``a`` and ``b``: a `SessionTotals` each: prompts, tokens sent, model usage, cost, runs.

`agent-flow sessions diff A B` prints it (or its JSON with ``--json``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from agent_flow._types import JsonValue
from agent_flow.events import AgentEvent, ContextBuilt, ModelResponded, RunFinished, RunStarted
from agent_flow.prompt import PromptBreakdown
from agent_flow.sessions.models import SessionState, numbering_run

__all__ = [
    "PointerDiff",
    "SessionDiff",
    "SessionTotals",
    "StepBudget",
    "StepComparison",
    "diff_environments",
    "diff_sessions",
    "step_budgets",
]


class PointerDiff(BaseModel):
    """One JSON pointer whose value differs between two environments.

    Attributes:
        pointer: Where (RFC 6901), e.g. ``/task/status`` or ``/knowledge/discovered_facts/2``.
        op: ``added`` (only in B), ``removed`` (only in A) or ``changed``.
        a: The value in A (``None`` when added).
        b: The value in B (``None`` when removed).
    """

    model_config = ConfigDict(frozen=True)

    pointer: str
    op: Literal["added", "removed", "changed"]
    a: JsonValue = None
    b: JsonValue = None


class StepBudget(BaseModel):
    """Where the tokens of one prompt of a session went.

    Attributes:
        step: The prompt's position in the session, from 1 (across runs).
        run: The session's run it belongs to, from 1 (a delegated child's prompt: the run
            that delegated to it, at the top of its tree).
        iteration: The iteration that built it (of the child's run, for a child's prompt).
        breakdown: The prompt's per-section split, as recorded.
        depth: 0 for the session's own runs; 1 for a delegated child's prompt, 2 for its own
            child's, and so on.
    """

    model_config = ConfigDict(frozen=True)

    step: int
    run: int
    iteration: int
    breakdown: PromptBreakdown
    depth: int = 0


class StepComparison(BaseModel):
    """The n-th prompt of each session (``None`` where a session built fewer).

    Attributes:
        step: The position, from 1.
        a: A's prompt at that step.
        b: B's prompt at that step.
    """

    model_config = ConfigDict(frozen=True)

    step: int
    a: StepBudget | None
    b: StepBudget | None

    @property
    def delta(self) -> int | None:
        """B's total tokens minus A's (``None`` unless both built this step)."""
        if self.a is None or self.b is None:
            return None
        return self.b.breakdown.total - self.a.breakdown.total


class SessionTotals(BaseModel):
    """One side of a comparison: the session and what its prompts and model calls cost.

    Attributes:
        id: The session's id.
        title: Its title.
        status: Its status.
        entries: History entries stored.
        events: Events stored.
        runs: The session's runs recorded (top-level ``run_started`` events).
        stop_reasons: Each finished run's stop reason, in order (the session's own runs).
        prompts: Prompts built (``context_built`` events).
        tokens_sent: The prompts' total tokens, as the budget counted them.
        units_omitted: History units left out of prompts, summed over the prompts.
        prompt_tokens: Prompt tokens the model reported (agent and summarizer calls).
        completion_tokens: Completion tokens the model reported.
        cost_usd: The model calls' cost, when every call's price was known.
        child_runs: Delegated child runs recorded (their prompts, calls, tokens and cost are
            in the other totals).
    """

    model_config = ConfigDict(frozen=True)

    id: str
    title: str
    status: str
    entries: int
    events: int
    runs: int
    stop_reasons: tuple[str, ...]
    prompts: int
    tokens_sent: int
    units_omitted: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    child_runs: int = 0


class SessionDiff(BaseModel):
    """What differs between session A and session B (see the module docstring).

    Attributes:
        a: A's totals.
        b: B's totals.
        environment: The pointers whose values differ, in document order.
        steps: The prompts side by side, step by step.
    """

    model_config = ConfigDict(frozen=True)

    a: SessionTotals
    b: SessionTotals
    environment: tuple[PointerDiff, ...]
    steps: tuple[StepComparison, ...]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _walk(a: JsonValue, b: JsonValue, pointer: str) -> Iterator[PointerDiff]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key, value in a.items():
            child = f"{pointer}/{_escape(key)}"
            if key in b:
                yield from _walk(value, b[key], child)
            else:
                yield PointerDiff(pointer=child, op="removed", a=value)
        for key, value in b.items():
            if key not in a:
                yield PointerDiff(pointer=f"{pointer}/{_escape(key)}", op="added", b=value)
        return
    if isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            child = f"{pointer}/{index}"
            if index >= len(b):
                yield PointerDiff(pointer=child, op="removed", a=a[index])
            elif index >= len(a):
                yield PointerDiff(pointer=child, op="added", b=b[index])
            else:
                yield from _walk(a[index], b[index], child)
        return
    # 1 and 1.0, or True and 1, are different JSON: compare the types too.
    if type(a) is not type(b) or a != b:
        yield PointerDiff(pointer=pointer, op="changed", a=a, b=b)


def diff_environments(a: JsonValue, b: JsonValue) -> list[PointerDiff]:
    """Return every pointer whose value differs between two JSON documents, in order.

    Objects are compared key by key (A's keys in order, then keys only B has), lists item by
    item, and anything else by value and JSON type; a whole subtree only one side has is one
    ``added`` or ``removed`` difference.

    Args:
        a: A's state (``environment.get("")``; ``None`` for a session without one).
        b: B's state.
    """
    return list(_walk(a, b, ""))


def step_budgets(events: Sequence[AgentEvent]) -> list[StepBudget]:
    """Return the breakdown of every prompt a session's events record, in order."""
    budgets: list[StepBudget] = []
    runs: dict[str, int] = {}
    for event in events:
        top = numbering_run(event)
        if isinstance(event, RunStarted):
            runs.setdefault(top, len(runs) + 1)
        elif isinstance(event, ContextBuilt):
            run = runs.setdefault(top, len(runs) + 1)
            budgets.append(
                StepBudget(
                    step=len(budgets) + 1,
                    run=run,
                    iteration=event.iteration,
                    breakdown=event.breakdown,
                    depth=len(event.path),
                )
            )
    return budgets


def _totals(state: SessionState, events: Sequence[AgentEvent]) -> SessionTotals:
    prompts = step_budgets(events)
    calls = [e for e in events if isinstance(e, ModelResponded)]
    costs = [c.cost_usd for c in calls]
    known = [c for c in costs if c is not None]
    info = state.info
    return SessionTotals(
        id=info.id,
        title=info.title,
        status=info.status,
        entries=len(state.entries),
        events=len(events),
        runs=sum(isinstance(e, RunStarted) and not e.path for e in events),
        stop_reasons=tuple(
            e.stop_reason for e in events if isinstance(e, RunFinished) and not e.path
        ),
        prompts=len(prompts),
        tokens_sent=sum(p.breakdown.total for p in prompts),
        units_omitted=sum(p.breakdown.history_units_omitted for p in prompts),
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
        cost_usd=sum(known) if calls and len(known) == len(costs) else None,
        child_runs=sum(isinstance(e, RunStarted) and bool(e.path) for e in events),
    )


def diff_sessions(
    a: SessionState,
    a_events: Sequence[AgentEvent],
    b: SessionState,
    b_events: Sequence[AgentEvent],
) -> SessionDiff:
    """Compare two sessions: their final environments and their prompts, step by step.

    Args:
        a: Session A as loaded (`SessionStore.load`).
        a_events: A's events (`SessionStore.events`).
        b: Session B as loaded.
        b_events: B's events.
    """
    a_state = a.environment.get("") if a.environment is not None else None
    b_state = b.environment.get("") if b.environment is not None else None
    a_steps, b_steps = step_budgets(a_events), step_budgets(b_events)
    steps = [
        StepComparison(
            step=index + 1,
            a=a_steps[index] if index < len(a_steps) else None,
            b=b_steps[index] if index < len(b_steps) else None,
        )
        for index in range(max(len(a_steps), len(b_steps)))
    ]
    return SessionDiff(
        a=_totals(a, a_events),
        b=_totals(b, b_events),
        environment=tuple(diff_environments(a_state, b_state)),
        steps=tuple(steps),
    )
