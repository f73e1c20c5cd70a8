from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.errors import UserError
from agent_flow.history import (
    SUMMARY_PREFIX,
    AgentMessage,
    AgentThinking,
    Chain,
    DropOldest,
    ElideToolResults,
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    PruningStrategy,
    SlidingWindow,
    SummarizeOldest,
    Summarizer,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
    build_units,
)
from agent_flow.messages import ChatMessage, ToolCall
from agent_flow.testing import assert_pinned_kept, assert_units_intact
from agent_flow.testing.strategies import (
    budgets_around,
    entry_lists,
    history_entries,
)
from agent_flow.tokens import REPLY_PRIMING_TOKENS, TiktokenCounter
from tests.pruning_helpers import (
    COUNTER,
    FixedSummarizer,
    conversation,
    ends_with_drop_oldest,
    ids,
    prune,
    pruners,
    total,
)
from tests.test_history import turn

# -- invariants of every strategy ----------------------------------------------------------


@settings(max_examples=200)
@given(data=st.data(), entries=entry_lists(max_units=18), strategy=pruners())
def test_any_strategy_keeps_units_whole_pinned_and_in_order(
    data: st.DataObject, entries: list[HistoryEntry], strategy: PruningStrategy | SummarizeOldest
) -> None:
    units = build_units(entries, COUNTER)
    budget = data.draw(budgets_around(units), label="budget")
    result = prune(strategy, units, budget)
    report = result.report
    before_ids, after_ids = ids(units), ids(result.units)

    # Unit integrity: what is sent never separates a call from its result.
    messages = [m for u in result.units for m in u.messages]
    assert_units_intact(result)
    # Units are whole: each is an input unit (perhaps with elided bodies) or a new summary.
    input_units = {u.ids for u in units}
    new_ids = set(after_ids) - set(before_ids)
    for unit in result.units:
        if set(unit.ids) & new_ids:
            assert unit.kind == "summary"
            assert unit.ids == (report.summary_id,)
        else:
            assert unit.ids in input_units
    # Order: the surviving entries keep their relative order.
    position = {entry_id: i for i, entry_id in enumerate(before_ids)}
    survivors = [position[i] for i in after_ids if i in position]
    assert survivors == sorted(survivors)
    # Pinned: the first user message always stays; a summary stays or is folded into the new one.
    assert_pinned_kept(units, result)
    # The report accounts for everything, and the counts are exact.
    assert report.tokens_before == total(units)
    assert report.tokens_after == total(result.units)
    assert report.tokens_after + REPLY_PRIMING_TOKENS == COUNTER.count_messages(messages)
    assert report.fits == (report.tokens_after <= budget)
    assert report.max_tokens == budget
    assert set(before_ids) - set(after_ids) <= set(report.dropped) | set(report.summarized)
    assert not (set(report.dropped) | set(report.summarized)) & set(after_ids)
    after_entries = {e.id: e for u in result.units for e in u.entries}
    for entry_id in report.elided:
        if entry_id in after_entries:
            elided = after_entries[entry_id]
            assert isinstance(elided, ToolResultEntry)
            assert elided.elided_tokens is not None
    assert list(result.units) == build_units(result.entries, COUNTER)
    # Fits whenever the pinned units fit, for strategies that end by dropping.
    if ends_with_drop_oldest(strategy) and total([u for u in units if u.pinned]) <= budget:
        assert report.fits


@settings(max_examples=60)
@given(entries=entry_lists(), strategy=pruners(), slack=st.integers(0, 50))
def test_strategies_change_nothing_when_the_history_fits(
    entries: list[HistoryEntry], strategy: PruningStrategy | SummarizeOldest, slack: int
) -> None:
    units = build_units(entries, COUNTER)
    result = prune(strategy, units, total(units) + slack)
    assert len(result.units) == len(units)
    assert all(a is b for a, b in zip(result.units, units, strict=True))
    assert result.report.fits
    assert not result.report.changed


@settings(max_examples=80)
@given(data=st.data(), entries=entry_lists(max_units=18))
def test_drop_oldest_drops_only_the_oldest_and_stops_as_soon_as_it_fits(
    data: st.DataObject, entries: list[HistoryEntry]
) -> None:
    units = build_units(entries, COUNTER)
    budget = data.draw(budgets_around(units))
    result = prune(DropOldest(), units, budget)
    kept = {id(u) for u in result.units}
    dropped = [i for i, u in enumerate(units) if id(u) not in kept]
    assert not any(units[i].pinned for i in dropped)
    if dropped:
        newest_dropped = dropped[-1]
        assert all(i in dropped for i in range(newest_dropped) if not units[i].pinned), (
            "a newer unit was dropped before an older one"
        )
        assert result.report.tokens_after + units[newest_dropped].tokens > budget
    assert result.report.fits == (total([u for u in units if u.pinned]) <= budget)


@settings(max_examples=80)
@given(data=st.data(), entries=entry_lists(max_units=18), turns=st.integers(1, 4))
def test_sliding_window_keeps_pinned_units_and_at_most_n_whole_turns(
    data: st.DataObject, entries: list[HistoryEntry], turns: int
) -> None:
    units = build_units(entries, COUNTER)
    budget = data.draw(budgets_around(units))
    result = prune(SlidingWindow(turns=turns), units, budget)
    kept = {id(u) for u in result.units}
    dropped = [i for i, u in enumerate(units) if id(u) not in kept]
    if not dropped:
        return
    edge = dropped[-1]
    # Everything not pinned before the edge went; everything after it stayed.
    assert dropped == [i for i in range(edge + 1) if not units[i].pinned]
    # The window starts at a turn with only pinned units before it after the edge, and holds
    # at most `turns` turns; units before the first user message form a turn of their own.
    starts = sorted({0} | {i for i, u in enumerate(units) if u.kind == "user"})
    cut = max(s for s in starts if s > edge and all(u.pinned for u in units[edge + 1 : s]))
    assert 1 <= sum(s >= cut for s in starts) <= turns


@settings(max_examples=80)
@given(data=st.data(), entries=entry_lists(max_units=18), keep_last=st.integers(0, 3))
def test_elision_never_drops_and_spares_the_last_results(
    data: st.DataObject, entries: list[HistoryEntry], keep_last: int
) -> None:
    units = build_units(entries, COUNTER)
    budget = data.draw(budgets_around(units))
    result = prune(ElideToolResults(keep_last=keep_last), units, budget)
    assert ids(result.units) == ids(units)
    before = [e for u in units for e in u.entries]
    after = [e for u in result.units for e in u.entries]
    results = [i for i, e in enumerate(before) if isinstance(e, ToolResultEntry)]
    spared = set(results[len(results) - keep_last :]) if keep_last else set()
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert [after[i].id for i in changed] == list(result.report.elided)
    for i in changed:
        old, new = before[i], after[i]
        assert isinstance(old, ToolResultEntry)
        assert isinstance(new, ToolResultEntry)
        assert i not in spared
        assert old.elided_tokens is None
        assert new.elided_tokens == COUNTER.count(old.content)
        assert new.content == f"[elided {new.elided_tokens:,} tokens of {old.tool_name} output]"
        assert (new.call_id, new.tool_name, new.is_error) == (
            old.call_id,
            old.tool_name,
            old.is_error,
        )
    if changed and result.report.fits:
        last_old, last_new = before[changed[-1]], after[changed[-1]]
        assert isinstance(last_old, ToolResultEntry)
        assert isinstance(last_new, ToolResultEntry)
        saved = COUNTER.count_message(tool_message(last_old)) - COUNTER.count_message(
            tool_message(last_new)
        )
        assert result.report.tokens_after + saved > budget, "elided more than needed"


def tool_message(result: ToolResultEntry) -> ChatMessage:
    return ChatMessage(
        role="tool", content=result.content, tool_call_id=result.call_id, name=result.tool_name
    )


@settings(max_examples=80)
@given(
    data=st.data(),
    entries=entry_lists(max_units=18),
    keep=st.integers(0, 5),
    cap=st.integers(1, 400),
)
def test_summarize_oldest_either_fits_or_changes_nothing(
    data: st.DataObject, entries: list[HistoryEntry], keep: int, cap: int
) -> None:
    units = build_units(entries, COUNTER)
    budget = data.draw(budgets_around(units))
    summarizer = ExtractiveSummarizer(counter=COUNTER)
    strategy = SummarizeOldest(summarizer, keep_last_units=keep, max_summary_tokens=cap)
    result = prune(strategy, units, budget)
    if result.report.summary_id is None:
        assert all(a is b for a, b in zip(result.units, units, strict=True))
        return
    assert result.report.fits
    (summary_unit,) = [u for u in result.units if u.ids == (result.report.summary_id,)]
    assert summary_unit.tokens <= cap
    summary = summary_unit.entries[0]
    assert isinstance(summary, Summary)
    assert summary.replaced_ids == result.report.summarized
    # The last `keep` units are untouched.
    if keep:
        assert [u.ids for u in result.units[-keep:]] == [u.ids for u in units[-keep:]]


@settings(max_examples=150)
@given(entries=st.lists(history_entries(), max_size=30), max_tokens=st.integers(0, 120))
def test_extractive_summaries_never_exceed_max_tokens_and_are_deterministic(
    entries: list[HistoryEntry], max_tokens: int
) -> None:
    summarizer = ExtractiveSummarizer(counter=COUNTER)
    text = asyncio.run(summarizer.summarize(entries, max_tokens=max_tokens))
    assert COUNTER.count(text) <= max_tokens
    assert asyncio.run(summarizer.summarize(entries, max_tokens=max_tokens)) == text
    full = "\n".join(summarizer.lines(entries))
    if COUNTER.count(full) <= max_tokens:
        assert text == full


# -- examples ------------------------------------------------------------------------------


def test_sliding_window_keeps_the_last_n_turns_and_the_task() -> None:
    history = conversation(6)
    budget = history.token_count() - 1
    report = history.prune(SlidingWindow(turns=2), budget)
    users = [e.content for e in history.entries if isinstance(e, UserMessage)]
    assert users == ["Request 0.", "Request 4.", "Request 5."]
    assert report.fits
    # Turns 1-3 whole (user, call turn of 3 entries, answer), and turn 0 but its user message.
    assert len(report.dropped) == 3 * 5 + 4
    assert [u.kind for u in history.units()][:2] == ["user", "user"]


def test_sliding_window_narrows_to_fit_but_keeps_the_last_turn() -> None:
    history = conversation(6)
    last_turn = total(history.units()[-3:])
    pinned = history.units()[0].tokens
    report = history.prune(SlidingWindow(turns=5), pinned + last_turn + 1)
    assert [e.content for e in history.entries if isinstance(e, UserMessage)] == [
        "Request 0.",
        "Request 5.",
    ]
    assert report.fits
    report = history.prune(SlidingWindow(turns=5), pinned)
    assert not report.fits
    assert len(history.units()) == 4


def test_elision_happens_before_dropping_in_a_chain() -> None:
    history = conversation(4)
    elided_size = history.token_count() - 3 * (COUNTER.count("line of output " * 40) - 20)
    # Eliding the three older bodies is enough: nothing is dropped.
    report = history.prune(Chain(ElideToolResults(keep_last=1), DropOldest()), elided_size)
    assert report.fits
    assert len(report.elided) == 3
    assert report.dropped == ()
    assert [s.strategy for s in report.steps] == ["elide_tool_results"]
    assert report.strategy == "chain(elide_tool_results, drop_oldest)"
    results = [e for e in history.entries if isinstance(e, ToolResultEntry)]
    assert [r.elided_tokens is not None for r in results] == [True, True, True, False]
    assert len([e for e in history.entries if isinstance(e, ToolCallEntry)]) == 4


def test_a_chain_drops_after_eliding_when_eliding_is_not_enough() -> None:
    history = conversation(4)
    report = history.prune(Chain(ElideToolResults(keep_last=1), DropOldest()), 300)
    assert report.fits
    assert len(report.elided) == 3
    assert report.dropped
    assert [s.strategy for s in report.steps] == ["elide_tool_results", "drop_oldest"]
    assert report.steps[0].tokens_after == report.steps[1].tokens_before
    assert history.entries[0].content == "Request 0."  # type: ignore[union-attr]
    assert history.token_count() <= 300


def test_elision_markers_count_real_tokens_with_tiktoken() -> None:
    counter = TiktokenCounter()
    history = History(counter=counter)
    history.add(UserMessage(content="Summarize the two files."))
    body = "def parse(line):\n    return line.split(',')\n" * 150
    turn(history, "a", body)
    turn(history, "b", body)
    report = history.prune(ElideToolResults(keep_last=1), history.token_count() - 100)
    assert report.fits
    (elided,) = [e for e in history.entries if isinstance(e, ToolResultEntry) and e.elided_tokens]
    assert elided.elided_tokens == counter.count(body)
    assert elided.content == f"[elided {counter.count(body):,} tokens of read_file output]"
    assert "," in elided.content  # thousands separator: the body is over 1,000 tokens
    assert history.token_count() + REPLY_PRIMING_TOKENS == counter.count_messages(
        history.to_messages()
    )


async def test_summarize_oldest_replaces_the_oldest_span_by_a_summary_entry() -> None:
    history = conversation(6)
    summarizer = ExtractiveSummarizer(counter=COUNTER)
    budget = history.token_count() // 2
    strategy = SummarizeOldest(summarizer, keep_last_units=3, max_summary_tokens=200)
    report = await history.fold(strategy, budget)
    assert report.fits
    units = history.units()
    assert units[0].entries[0].content == "Request 0."  # type: ignore[union-attr]
    assert units[1].kind == "summary"
    summary = units[1].entries[0]
    assert isinstance(summary, Summary)
    assert summary.id == report.summary_id
    assert summary.replaced_ids == report.summarized
    assert summary.content.startswith("- Agent: Calling read_file.")
    assert "- User: Request 1." in summary.content
    assert history.to_messages()[1].content.startswith(SUMMARY_PREFIX + "\n- Agent:")
    # A second pass folds the first summary into a new one instead of stacking them.
    for i in range(6, 9):
        history.add(UserMessage(content=f"Request {i}."))
        turn(history, f"c{i}", "line of output " * 40)
    second = await history.fold(strategy, budget)
    assert report.summary_id in second.summarized
    assert [u.kind for u in history.units()].count("summary") == 1


async def test_summarize_oldest_with_tiktoken_keeps_the_summary_within_its_cap() -> None:
    counter = TiktokenCounter()
    history = History(counter=counter)
    history.add(UserMessage(content="Port the CLI to asyncio. Keep the flags."))
    for i in range(20):
        turn(history, f"c{i}", f"module {i}: " + "async def main(): ... " * 30)
    strategy = SummarizeOldest(
        ExtractiveSummarizer(counter=counter), keep_last_units=2, max_summary_tokens=120
    )
    report = await history.fold(strategy, 900)
    assert report.fits
    assert history.units()[1].tokens <= 120
    assert "more events omitted" in history.units()[1].entries[0].content  # type: ignore[union-attr]


def test_pinned_units_too_big_for_the_budget_are_kept_and_reported() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="word " * 400))
    history.add(Summary(content="earlier " * 100, replaced_ids=()))
    turn(history, "c1")
    history.add(UserMessage(content="Go on."))
    turn(history, "c2")
    strategies: list[PruningStrategy] = [DropOldest(), Chain(ElideToolResults(), DropOldest())]
    for strategy in strategies:
        result = strategy.prune(history.units(), 50, COUNTER)
        assert not result.report.fits
        assert [u.kind for u in result.units] == ["user", "summary"]
    # The window keeps the pinned units and always the last turn.
    result = SlidingWindow(turns=1).prune(history.units(), 50, COUNTER)
    assert not result.report.fits
    assert [u.kind for u in result.units] == ["user", "summary", "user", "assistant"]
    assert len(result.report.dropped) == 3


async def test_a_summarizer_that_ignores_max_tokens_is_cut_to_fit() -> None:
    history = conversation(5)
    summarizer = FixedSummarizer("far too long " * 500)
    strategy = SummarizeOldest(summarizer, keep_last_units=2, max_summary_tokens=64)
    assert isinstance(summarizer, Summarizer)
    report = await history.fold(strategy, history.token_count() // 2)
    assert report.fits
    assert history.units()[1].tokens <= 64
    assert history.units()[1].entries[0].content.endswith("…")  # type: ignore[union-attr]
    ((folded, max_tokens),) = summarizer.calls
    assert max_tokens == 64 - COUNTER.count_message(
        ChatMessage(role="user", content=SUMMARY_PREFIX + "\n")
    )
    assert folded == list(report.summarized)


async def test_summarize_oldest_changes_nothing_when_no_useful_summary_fits() -> None:
    history = conversation(3)
    units = tuple(history.units())
    summarizer = FixedSummarizer("x")
    result = await SummarizeOldest(summarizer, keep_last_units=0).fold(units, 5, COUNTER)
    assert result.units == units
    assert not result.report.fits
    assert summarizer.calls == []


def test_extractive_summary_lines_say_who_said_and_did_what() -> None:
    entries: list[HistoryEntry] = [
        UserMessage(content="Fix the failing test. It is in tests/test_io.py."),
        AgentThinking(content="secret reasoning"),
        AgentMessage(content="Let me run it!  Then I will read the file."),
        ToolCallEntry(
            call=ToolCall(
                id="1", name="run_tests", arguments='{"path": "tests/test_io.py", "k": 3}'
            )
        ),
        ToolCallEntry(call=ToolCall(id="2", name="read_file", arguments="not json")),
        ToolCallEntry(call=ToolCall(id="3", name="grep", arguments="{}")),
        ToolResultEntry(
            call_id="1", tool_name="run_tests", content="1 failed. Details...", is_error=True
        ),
        ToolResultEntry(call_id="2", tool_name="read_file", content="x" * 1234),
        Summary(content="- User: Earlier.\nplain line", replaced_ids=()),
    ]
    lines = ExtractiveSummarizer(counter=COUNTER).lines(entries)
    assert lines == [
        "- User: Fix the failing test.",
        "- Agent: Let me run it!",
        '- Agent called run_tests(path="tests/test_io.py", k=3) → error: 1 failed.',
        "- Agent called read_file(not json) → ok, 1,234 chars",
        "- Agent called grep() → no result",
        "- User: Earlier.",
        "- plain line",
    ]


async def test_extractive_summary_keeps_the_oldest_and_newest_lines_when_cut() -> None:
    entries = [UserMessage(id=f"u{i}", content=f"Message number {i}.") for i in range(40)]
    summarizer = ExtractiveSummarizer(counter=TiktokenCounter())
    text = await summarizer.summarize(entries, max_tokens=60)
    lines = text.splitlines()
    assert TiktokenCounter().count(text) <= 60
    assert lines[0] == "- User: Message number 0."
    assert lines[-1] == "- User: Message number 39."
    (marker,) = [line for line in lines if "omitted" in line]
    assert marker == f"- … {40 - len(lines) + 1} more events omitted"


@pytest.mark.parametrize(
    "make",
    [
        lambda: SlidingWindow(turns=0),
        lambda: ElideToolResults(keep_last=-1),
        lambda: SummarizeOldest(ExtractiveSummarizer(counter=COUNTER), keep_last_units=-1),
        lambda: SummarizeOldest(ExtractiveSummarizer(counter=COUNTER), max_summary_tokens=0),
        lambda: Chain(),
    ],
)
def test_bad_strategy_parameters_raise_user_errors(make: object) -> None:
    with pytest.raises(UserError):
        make()  # type: ignore[operator]


async def test_a_negative_budget_raises() -> None:
    with pytest.raises(UserError, match="-1"):
        History(counter=COUNTER).prune(DropOldest(), -1)
    with pytest.raises(UserError, match="-1"):
        DropOldest().prune((), -1, COUNTER)
    with pytest.raises(UserError, match="-1"):
        await History(counter=COUNTER).fold(SummarizeOldest(FixedSummarizer("x")), -1)
    with pytest.raises(UserError, match="-1"):
        await SummarizeOldest(FixedSummarizer("x")).fold((), -1, COUNTER)


def test_built_in_strategies_satisfy_the_protocols() -> None:
    summarizer = ExtractiveSummarizer(counter=COUNTER)
    assert isinstance(summarizer, Summarizer)
    for strategy in [
        DropOldest(),
        SlidingWindow(turns=1),
        ElideToolResults(),
        Chain(DropOldest()),
    ]:
        assert isinstance(strategy, PruningStrategy)
        assert strategy.name
    # Summarizing awaits its summarizer: it is a step of its own, not a sync strategy.
    assert not isinstance(SummarizeOldest(summarizer), PruningStrategy)
