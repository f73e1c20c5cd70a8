"""Model calls to publish with steps, and a session's usage totals computed from its events.

`call_steps` draws what a run's steps publish (model calls of the agent or the summarizer,
priced or not, estimated or not, between other events); `expected_totals` sums the stored
``ModelResponded`` events independently of the stores' own code, in the order they were stored.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from agent_flow.events import AgentEvent, ModelResponded, TextDelta

#: One drawn event: None for a non-call event, else (prompt, completion, cost, source, estimated).
Drawn = tuple[int, int, float | None, str, bool] | None

drawn_calls: st.SearchStrategy[Drawn] = st.none() | st.tuples(
    st.integers(0, 200_000),
    st.integers(0, 50_000),
    st.none() | st.floats(0, 5, allow_nan=False, allow_infinity=False),
    st.sampled_from(["agent", "summarizer"]),
    st.booleans(),
)

#: The events of each step: a few steps of a few events each.
call_steps = st.lists(st.lists(drawn_calls, max_size=4), min_size=1, max_size=5)


def step_events(drawn: Sequence[Drawn], run_id: str, first_seq: int = 0) -> list[AgentEvent]:
    """The events of one step, numbered from `first_seq` in run `run_id`."""
    events: list[AgentEvent] = []
    for seq, item in enumerate(drawn, first_seq):
        if item is None:
            events.append(TextDelta(run_id=run_id, seq=seq, text="x"))
            continue
        prompt, completion, cost, source, estimated = item
        events.append(
            ModelResponded(
                run_id=run_id,
                seq=seq,
                iteration=1,
                finish_reason="stop",
                prompt_tokens=prompt,
                completion_tokens=completion,
                tool_calls=0,
                duration_ms=1.0,
                source=source,  # type: ignore[arg-type]
                cost_usd=cost,
                estimated=estimated,
            )
        )
    return events


def expected_totals(events: Sequence[AgentEvent]) -> dict[str, object]:
    """The usage fields a `SessionInfo` must show for a session that stored `events`."""
    calls = [e for e in events if isinstance(e, ModelResponded)]
    cost: float | None = 0.0
    for call in calls:  # in stored order, one call at a time, as the stores add them
        cost = None if cost is None or call.cost_usd is None else cost + call.cost_usd
    return {
        "model_calls": len(calls),
        "prompt_tokens": sum(c.prompt_tokens for c in calls),
        "completion_tokens": sum(c.completion_tokens for c in calls),
        "cost_usd": cost,
        "unpriced_calls": sum(c.cost_usd is None for c in calls),
        "estimated_calls": sum(c.estimated for c in calls),
    }
