"""A session's model calls, tokens and cost over all its runs, kept up to date by every step.

Each `save_step` adds the ``ModelResponded`` events it appends (the agent's calls and the
summarizer's alike) to the totals stored on the session's row, in the step's transaction: the
work is proportional to the step's new events, never to the session's length. Costs add in the
order the calls were stored, one at a time, so the stored total equals, to the last bit, the
sum over the stored events taken in order (what `_Totals.over` computes, and what migrations
and imports compute from the events).

Unknown prices stay unknown: once a call's ``cost_usd`` is None the session's ``cost_usd`` is
None for good, and ``unpriced_calls`` counts such calls; it is never a misleading 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agent_flow.sessions.models import SessionInfo

#: The `SessionInfo` fields (and store columns) the totals are kept in, in column order.
USAGE_FIELDS = (
    "model_calls",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "unpriced_calls",
    "estimated_calls",
)
USAGE_COLUMNS = ", ".join(USAGE_FIELDS)
_CALL_KIND = "model_responded"

#: The stored model calls of every session, in order: what a migration sums (`_backfill`).
CALLS_QUERY = (
    f"SELECT session_id, kind, data FROM events WHERE kind = '{_CALL_KIND}' "
    "ORDER BY session_id, position"
)


def _assignments(placeholder: str) -> str:
    """``model_calls = ?, ...`` for an UPDATE of the usage columns (each with `placeholder`).

    ``{name}`` in `placeholder` is the column's name (named parameters: ``%(s_{name})s``).
    """
    return ", ".join(f"{name} = {placeholder.format(name=name)}" for name in USAGE_FIELDS)


def _backfill(rows: Iterable[Sequence[str]]) -> list[tuple[object, ...]]:
    """The totals of each session (then its id) from (session_id, kind, data) rows in order."""
    calls: dict[str, list[tuple[str, str]]] = {}
    for sid, kind, data in rows:
        calls.setdefault(sid, []).append((kind, data))
    return [(*_Totals.over(pairs).values(), sid) for sid, pairs in calls.items()]


@dataclass(frozen=True, slots=True)
class _Totals:
    """A session's usage totals (see `SessionInfo` for each field)."""

    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    unpriced_calls: int = 0
    estimated_calls: int = 0

    @classmethod
    def of(cls, info: SessionInfo) -> _Totals:
        return cls(*(getattr(info, name) for name in USAGE_FIELDS))

    @classmethod
    def over(cls, events: Iterable[tuple[str, str]]) -> _Totals:
        """The totals of a session whose stored events are `events` ((kind, JSON) in order)."""
        return cls().add(events)

    def add(self, events: Iterable[tuple[str, str]]) -> _Totals:
        """These totals plus the model calls among `events` ((kind, JSON) pairs, in order)."""
        calls, prompt, completion = self.model_calls, self.prompt_tokens, self.completion_tokens
        cost, unpriced, estimated = self.cost_usd, self.unpriced_calls, self.estimated_calls
        for kind, data in events:
            if kind != _CALL_KIND:
                continue
            call = json.loads(data)
            calls += 1
            prompt += call["prompt_tokens"]
            completion += call["completion_tokens"]
            if call.get("estimated", False):
                estimated += 1
            price = call.get("cost_usd")
            if price is None:
                unpriced += 1
                cost = None
            elif cost is not None:
                cost += price
        return _Totals(calls, prompt, completion, cost, unpriced, estimated)

    def values(self) -> tuple[int, int, int, float | None, int, int]:
        """The totals in `USAGE_FIELDS` order (for an INSERT or UPDATE)."""
        return (
            self.model_calls,
            self.prompt_tokens,
            self.completion_tokens,
            self.cost_usd,
            self.unpriced_calls,
            self.estimated_calls,
        )

    def fields(self) -> dict[str, Any]:
        """The totals as `SessionInfo` fields (for ``model_copy(update=...)``)."""
        return dict(zip(USAGE_FIELDS, self.values(), strict=True))
