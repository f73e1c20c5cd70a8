"""Pruning and summarizing through the History: what changes, what is kept, what is counted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_flow._text import truncate_to_tokens
from agent_flow.errors import UserError
from agent_flow.history import (
    HISTORY_ENTRY_ADAPTER,
    AgentMessage,
    DropOldest,
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    PruneReport,
    PruneResult,
    SummarizeOldest,
    ToolCallEntry,
    ToolResultEntry,
    Unit,
    UserMessage,
)
from agent_flow.messages import ChatMessage, ToolCall
from tests.history_helpers import COUNTER, assert_consistent, turn

# -- prune and summarize on the History -----------------------------------------------------


def test_prune_applies_the_strategy_and_reuses_kept_units() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Task."))
    for i in range(10):
        turn(history, f"c{i}", "body " * 50)
    kept_before = history.units()[-1]
    version = history.version
    report = history.prune(DropOldest(), 200)
    assert report.fits
    assert history.token_count() <= 200
    assert history.version == version + 1
    assert history.units()[-1] is kept_before
    assert set(report.dropped).isdisjoint(e.id for e in history.entries)
    assert_consistent(history)


def test_results_can_still_be_added_after_pruning_when_their_turn_is_kept() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Task."))
    turn(history, "old", "body " * 200)
    history.add(AgentMessage(content="Two more."))
    history.add(ToolCallEntry(call=ToolCall(id="x", name="search")))
    history.add(ToolCallEntry(call=ToolCall(id="y", name="search")))
    history.add(ToolResultEntry(call_id="x", tool_name="search", content="found"))
    history.prune(DropOldest(), 60)
    assert [c.call_id for c in history.pending_calls()] == ["y"]
    history.add(ToolResultEntry(call_id="y", tool_name="search", content="found too"))
    assert history.pending_calls() == []
    assert_consistent(history)


class DropSecondUnit:
    """A careless custom strategy: drops the second unit, whatever it is."""

    name = "drop_second"

    def prune(self, units, max_tokens, counter):  # type: ignore[no-untyped-def]
        kept = (units[0], *units[2:])
        report = PruneReport(
            strategy=self.name,
            tokens_before=sum(u.tokens for u in units),
            tokens_after=sum(u.tokens for u in kept),
            max_tokens=max_tokens,
            dropped=units[1].ids,
            fits=True,
        )
        return PruneResult(kept, report)


def test_units_that_a_custom_strategy_makes_adjacent_are_merged_as_grouping_would() -> None:
    history = History(counter=COUNTER)
    history.add(AgentMessage(content="Hello."))
    history.add(UserMessage(content="Hi."))
    history.add(AgentMessage(content="What now?"))
    history.prune(DropSecondUnit(), 0)
    assert [u.kind for u in history.units()] == ["assistant"]
    assert history.to_messages() == [ChatMessage(role="assistant", content="Hello.\n\nWhat now?")]
    assert_consistent(history)


def test_units_that_cannot_merge_make_prune_raise_and_change_nothing() -> None:
    history = History(counter=COUNTER)
    history.add(ToolCallEntry(call=ToolCall(id="call_0", name="search")))
    history.add(UserMessage(content="Hi."))
    history.add(ToolCallEntry(call=ToolCall(id="call_0", name="search")))
    before = list(history.entries)
    with pytest.raises(UserError, match="call_0"):
        history.prune(DropSecondUnit(), 0)
    assert list(history.entries) == before
    assert_consistent(history)


class SlowSummarizer:
    """Summarizes only once released, so that the test can act while a summary is awaited."""

    def __init__(self, started: asyncio.Event, release: asyncio.Event) -> None:
        self.started, self.release = started, release

    async def summarize(self, entries: Sequence[HistoryEntry], *, max_tokens: int) -> str:
        self.started.set()
        await self.release.wait()
        return "- Earlier work."


async def test_adding_while_a_fold_awaits_its_summarizer_makes_the_fold_raise() -> None:
    history = History([UserMessage(content="Go.")], counter=COUNTER)
    for i in range(6):
        turn(history, f"c{i}", "body " * 40)
    started, release = asyncio.Event(), asyncio.Event()
    step = SummarizeOldest(SlowSummarizer(started, release), keep_last_units=1)
    task = asyncio.create_task(history.fold(step, history.token_count() // 2))
    await started.wait()
    history.add(UserMessage(content="Meanwhile."))
    release.set()
    with pytest.raises(UserError, match="changed"):
        await task
    assert len(history) == 20
    assert_consistent(history)


def test_prune_is_synchronous_and_a_strategy_that_adds_entries_makes_it_raise() -> None:
    history = History(
        [UserMessage(content="Go."), AgentMessage(content="a " * 99)], counter=COUNTER
    )

    class Meddler:
        name = "meddler"

        def prune(self, units, max_tokens, counter):  # type: ignore[no-untyped-def]
            history.add(UserMessage(content="Meanwhile."))
            return DropOldest().prune(units, max_tokens, counter)

    with pytest.raises(UserError, match="changed"):
        history.prune(Meddler(), 10)
    assert len(history) == 3


async def test_summarize_replaces_a_span_widened_to_units_by_one_summary() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Fix the parser. It fails on CRLF."))
    turn(history, "c1", "file one " * 30)
    turn(history, "c2", "file two " * 30)
    history.add(UserMessage(content="Also check the lexer."))
    ids = [e.id for e in history.entries]
    # Starts inside the first turn, ends inside the second: widened to both whole turns.
    summary = await history.summarize(2, 5, ExtractiveSummarizer(counter=COUNTER))
    assert summary.replaced_ids == tuple(ids[1:7])
    assert [e.id for e in history.entries] == [ids[0], summary.id, ids[7]]
    assert [u.kind for u in history.units()] == ["user", "summary", "user"]
    assert summary.content.splitlines() == [
        "- Agent: Calling read_file.",
        '- Agent called read_file(path="a.py") → ok, 270 chars',
        "- Agent: Calling read_file.",
        '- Agent called read_file(path="a.py") → ok, 270 chars',
    ]
    assert_consistent(history)


async def test_summarize_never_folds_the_first_user_message_and_merges_summaries() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Task."))
    turn(history, "c1")
    first = await history.summarize(0, len(history), ExtractiveSummarizer(counter=COUNTER))
    assert history.units()[0].entries[0].content == "Task."  # type: ignore[union-attr]
    turn(history, "c2")
    second = await history.summarize(1, len(history), ExtractiveSummarizer(counter=COUNTER))
    assert first.id in second.replaced_ids
    assert [u.kind for u in history.units()] == ["user", "summary"]
    assert second.content.count("- Agent called read_file") == 2
    with pytest.raises(UserError, match="only the pinned first user message"):
        await history.summarize(0, 1, ExtractiveSummarizer(counter=COUNTER))


async def test_summarize_cuts_the_summary_to_max_tokens() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Task."))
    for i in range(30):
        turn(history, f"c{i}")
    summary = await history.summarize(1, len(history), ExtractiveSummarizer(), max_tokens=60)
    assert history.units()[1].tokens <= 60
    assert "more events omitted" in summary.content
    assert_consistent(history)


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [(0, 0, "start < end"), (-1, 2, "start < end"), (0, 99, "start < end"), (2, 4, "waiting")],
)
async def test_summarize_refuses_bad_spans(start: int, end: int, message: str) -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Task."))
    history.add(ToolCallEntry(call=ToolCall(id="p", name="search")))
    history.add(ToolCallEntry(call=ToolCall(id="q", name="search")))
    history.add(ToolResultEntry(call_id="q", tool_name="search", content="."))
    with pytest.raises(UserError, match=message):
        await history.summarize(start, end, ExtractiveSummarizer(counter=COUNTER))


async def test_summarize_with_no_room_for_the_header_raises() -> None:
    history = History([UserMessage(content="a"), AgentMessage(content="b")], counter=COUNTER)
    with pytest.raises(UserError, match="max_tokens=3"):
        await history.summarize(1, 2, ExtractiveSummarizer(counter=COUNTER), max_tokens=3)


@settings(max_examples=200)
@given(
    # No whitespace: the cut strips trailing spaces, which would blur the length check below.
    text=st.text(st.characters(exclude_categories=["Z", "C"]), max_size=300),
    max_tokens=st.integers(0, 80),
)
def test_truncate_to_tokens_keeps_a_long_fitting_prefix(text: str, max_tokens: int) -> None:
    cut, _ = truncate_to_tokens(text, max_tokens, COUNTER.count)
    assert COUNTER.count(cut) <= max_tokens
    if COUNTER.count(text) <= max_tokens:
        assert cut == text
    elif cut:
        assert cut.endswith("…")
        assert text.startswith(cut[:-1])
        # The binary search finds a long prefix, not just any: a third more would not fit.
        grown = len(cut) - 1 + max(4, (len(cut) - 1) // 3) * 4
        if grown < len(text):
            assert COUNTER.count(text[:grown] + "…") > max_tokens


def test_units_are_frozen() -> None:
    (unit,) = History([UserMessage(content="a")], counter=COUNTER).units()
    assert isinstance(unit, Unit)
    with pytest.raises(AttributeError):
        unit.tokens = 0  # type: ignore[misc]


def test_a_tool_call_entry_holds_the_models_call_and_reads_older_flat_entries() -> None:
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "a"}')
    entry = ToolCallEntry(call=call)
    older = HISTORY_ENTRY_ADAPTER.validate_json(
        '{"kind": "tool_call", "id": "e1", "timestamp": "2026-01-01T00:00:00Z", '
        '"call_id": "c1", "name": "read_file", "arguments": "{\\"path\\": \\"a\\"}"}'
    )

    assert entry.call is call and entry.call_id == "c1"
    assert isinstance(older, ToolCallEntry) and older.call == call
    assert HISTORY_ENTRY_ADAPTER.validate_json(HISTORY_ENTRY_ADAPTER.dump_json(entry)) == entry


def test_a_recorded_tool_call_needs_a_name() -> None:
    with pytest.raises(ValidationError, match="non-empty id and tool name"):
        ToolCallEntry(call=ToolCall(id="c1", name=""))
