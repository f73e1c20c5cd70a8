"""Summarizing as its own async step, apart from pruning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.errors import UserError
from agent_flow.history import (
    Chain,
    DropOldest,
    ElideToolResults,
    HistoryEntry,
    SummarizeOldest,
    Summarizer,
    Summary,
    build_units,
)
from agent_flow.testing.strategies import (
    budgets_around,
    entry_lists,
)
from tests.pruning_helpers import (
    COUNTER,
    FixedSummarizer,
    conversation,
    prune,
    total,
)

# -- summarizing as its own async step ------------------------------------------------------


class AsyncStrategy:
    """A strategy written for the old async protocol."""

    name = "async_drop"

    async def prune(self, units, max_tokens, counter):  # type: ignore[no-untyped-def]
        return DropOldest().prune(units, max_tokens, counter)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Chain(ElideToolResults(), SummarizeOldest(FixedSummarizer("x")), DropOldest()),
        lambda: SummarizeOldest(FixedSummarizer("x"), after=SummarizeOldest(FixedSummarizer("y"))),
        lambda: Chain(AsyncStrategy()),
        lambda: SummarizeOldest(FixedSummarizer("x"), before=AsyncStrategy()),
    ],
)
def test_no_await_can_hide_inside_a_chain_or_around_a_summary(make: object) -> None:
    with pytest.raises(UserError, match="PruningStrategy"):
        make()  # type: ignore[operator]


def test_history_prune_refuses_a_summarizing_step_or_an_async_strategy() -> None:
    history = conversation(3)
    before = list(history.entries)
    with pytest.raises(UserError, match="SummarizeOldest"):
        history.prune(SummarizeOldest(FixedSummarizer("x")), 10)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="synchronous"):
        history.prune(AsyncStrategy(), 10)
    assert list(history.entries) == before


async def test_history_fold_refuses_a_sync_strategy() -> None:
    with pytest.raises(UserError, match="prune"):
        await conversation(3).fold(DropOldest(), 10)  # type: ignore[arg-type]


def summarize_configuration(summarizer: Summarizer) -> SummarizeOldest:
    """What ``ContextConfig(strategy="summarize")`` builds, with another summarizer."""
    return SummarizeOldest(summarizer, before=ElideToolResults(), after=DropOldest())


async def test_the_summarize_configuration_elides_then_summarizes_then_drops() -> None:
    step = summarize_configuration(FixedSummarizer("- Read the files."))
    assert step.name == "chain(elide_tool_results, summarize_oldest, drop_oldest)"
    assert repr(step).endswith("before=ElideToolResults(keep_last=2), after=DropOldest())")
    elided_only = conversation(6)
    # Eliding the older bodies is enough: the summarizer is never asked.
    report = await elided_only.fold(step, elided_only.token_count() - 100)
    assert [s.strategy for s in report.steps] == ["elide_tool_results"]
    assert report.fits and report.elided and report.summary_id is None
    assert step.summarizer.calls == []  # type: ignore[attr-defined]
    # Eliding is not enough: the oldest units are folded into the summary after eliding.
    summarized = conversation(6)
    report = await summarized.fold(step, summarized.token_count() // 3)
    assert [s.strategy for s in report.steps] == ["elide_tool_results", "summarize_oldest"]
    assert report.fits and report.elided and report.summary_id is not None
    assert report.strategy == step.name
    (summary,) = [e for e in summarized.entries if isinstance(e, Summary)]
    assert summary.id == report.summary_id and summary.content == "- Read the files."
    assert set(report.elided) & set(summary.replaced_ids), "the summary folds elided results"
    # Not even a summary is enough: the oldest units are dropped last.
    dropped = conversation(6)
    report = await dropped.fold(step, dropped.units()[0].tokens + 40)
    assert [s.strategy for s in report.steps] == [
        "elide_tool_results",
        "summarize_oldest",
        "drop_oldest",
    ]
    assert report.fits and report.dropped
    assert dropped.token_count() == report.tokens_after


@settings(max_examples=80)
@given(data=st.data(), entries=entry_lists(max_units=18))
def test_a_summarizing_step_asks_its_summarizer_only_when_its_before_strategy_is_not_enough(
    data: st.DataObject, entries: list[HistoryEntry]
) -> None:
    units = build_units(entries, COUNTER)
    budget = data.draw(budgets_around(units))
    summarizer = FixedSummarizer("- Earlier work.")
    result = prune(summarize_configuration(summarizer), units, budget)
    elided = ElideToolResults().prune(units, budget, COUNTER)
    if elided.report.fits:
        assert summarizer.calls == []
        assert [u.ids for u in result.units] == [u.ids for u in elided.units]
        assert result.report.steps == (elided.report,) or not elided.report.changed
    else:
        assert result.report.steps[0] == elided.report
        if total([u for u in units if u.pinned]) <= budget:
            assert result.report.fits
