"""The metric points the loop queues reach the SDK intact, at collection or in place."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from agent_flow.prompt import PromptBreakdown
from agent_flow.telemetry import _metrics


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    return points


@given(
    values=st.lists(st.integers(min_value=0, max_value=10_000), max_size=60),
    cap=st.integers(min_value=0, max_value=30),
)
def test_every_queued_point_is_recorded_once_whatever_the_queue_holds(
    values: list[int], cap: int
) -> None:
    _metrics.flush_pending()
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    metrics = _metrics._Metrics(meters.get_meter("test"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_metrics, "_MAX_PENDING", cap)
        for value in values:
            metrics._queue(metrics._pruned_tokens.add, value, {"k": "v"})
            assert len(_metrics._pending) <= cap
    points = _points(reader)
    meters.shutdown()
    assert not _metrics._pending
    if values:
        [point] = points["agent_flow.history.pruned_tokens"]
        assert point.value == sum(values)
        assert dict(point.attributes) == {"k": "v"}
    assert "agent_flow.telemetry.flush" not in points  # it observes nothing


def test_a_collection_records_every_providers_points_into_their_own_instruments() -> None:
    _metrics.flush_pending()
    readers = [InMemoryMetricReader(), InMemoryMetricReader()]
    providers = [MeterProvider(metric_readers=[reader]) for reader in readers]
    first, second = (_metrics._Metrics(p.get_meter("test")) for p in providers)
    first._queue(first._pruned_tokens.add, 3, {})
    second._queue(second._pruned_tokens.add, 5, {})
    assert len(_metrics._pending) == 2
    # The second provider collects first: it records both, each into its own instrument.
    assert _points(readers[1])["agent_flow.history.pruned_tokens"][0].value == 5
    assert not _metrics._pending
    assert _points(readers[0])["agent_flow.history.pruned_tokens"][0].value == 3
    for provider in providers:
        provider.shutdown()


@given(
    prompts=st.lists(
        st.tuples(
            st.sampled_from([1000, 2000]),  # budget
            st.integers(min_value=0, max_value=3),  # reserve (x 100)
            st.integers(min_value=0, max_value=900),  # history
        ),
        min_size=1,
        max_size=12,
    )
)
def test_the_varying_shares_are_recorded_for_every_prompt_the_steady_ones_as_they_change(
    prompts: list[tuple[int, int, int]],
) -> None:
    _metrics.flush_pending()
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    metrics = _metrics._Metrics(meters.get_meter("test"))
    previous: PromptBreakdown | None = None
    for budget, reserve, history in prompts:
        breakdown = PromptBreakdown(
            budget=budget, reserve=reserve * 100, system_template=50, environment=20, tools=30,
            history=history, priming=3, total=103 + history, environment_degraded=False,
            history_units_sent=1, history_units_omitted=0,
        )  # fmt: skip
        metrics.prompt(breakdown, previous)
        previous = breakdown
    points = _points(reader)
    meters.shutdown()
    counts = {
        p.attributes["agent_flow.prompt.section"]: p.count
        for p in points["agent_flow.context.utilization"]
    }
    assert counts["history"] == counts["total"] == len(prompts)
    # A steady section is recorded at the first prompt and whenever its share changes.
    for section, size in (("reserve", lambda r: r * 100), ("priming", lambda r: 3)):
        shares = [size(reserve) / budget for budget, reserve, _ in prompts]
        changed = sum(a != b for a, b in itertools.pairwise(shares))
        assert counts[section] == 1 + changed, section
