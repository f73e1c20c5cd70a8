from __future__ import annotations

import asyncio
import itertools
import json
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_flow.errors import UserError
from agent_flow.history import (
    HISTORY_ENTRY_ADAPTER,
    SUMMARY_PREFIX,
    AgentMessage,
    AgentThinking,
    History,
    HistoryEntry,
    PruningStrategy,
    SummarizeOldest,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
    build_units,
    dump_entries,
    load_entries,
)
from agent_flow.history.entries import _Entry
from agent_flow.messages import ChatMessage, ToolCall
from agent_flow.testing.strategies import (
    entry_lists,
    history_entries,
    pruning_strategies,
    summarize_steps,
)
from agent_flow.tokens import REPLY_PRIMING_TOKENS, TiktokenCounter
from tests.history_helpers import COUNTER, assert_consistent, turn

# -- entries and JSON ----------------------------------------------------------------------


def test_every_entry_class_is_a_member_of_the_union() -> None:
    union = typing.get_args(typing.get_args(HistoryEntry)[0])
    assert set(union) == set(_Entry.__subclasses__())
    kinds = [cls.model_fields["kind"].default for cls in union]
    assert len(set(kinds)) == len(kinds)


@settings(max_examples=200)
@given(entry=history_entries())
def test_every_entry_round_trips_through_json(entry: HistoryEntry) -> None:
    text = HISTORY_ENTRY_ADAPTER.dump_json(entry)
    again = HISTORY_ENTRY_ADAPTER.validate_json(text)
    assert again == entry
    assert type(again) is type(entry)
    assert json.loads(text)["kind"] == entry.kind


def test_entries_are_frozen_and_get_an_id_and_a_utc_timestamp() -> None:
    first, second = UserMessage(content="a"), UserMessage(content="a")
    assert first.id != second.id
    assert first.timestamp.utcoffset() is not None
    with pytest.raises(ValidationError):
        first.content = "b"  # type: ignore[misc]


def test_naive_timestamps_and_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        HISTORY_ENTRY_ADAPTER.validate_python(
            {"kind": "user_message", "content": "x", "timestamp": "2020-01-01T00:00:00"}
        )
    with pytest.raises(ValidationError):
        HISTORY_ENTRY_ADAPTER.validate_python({"kind": "user_message", "content": "x", "y": 1})


@settings(max_examples=50)
@given(entries=entry_lists())
def test_a_history_round_trips_through_json_with_the_same_messages(
    entries: list[HistoryEntry],
) -> None:
    history = History(entries, counter=COUNTER)
    again = History.from_json(history.to_json(), counter=COUNTER)
    assert list(again.entries) == list(history.entries)
    assert again.to_messages() == history.to_messages()
    assert again.token_count() == history.token_count()
    assert load_entries(dump_entries(entries)) == entries


# -- units and messages --------------------------------------------------------------------


def test_a_turn_with_its_calls_and_results_forms_one_unit_in_call_order() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Compare a.py and b.py."))
    history.add(AgentThinking(content="I should read both."))
    history.add(AgentMessage(content="Reading both files."))
    history.add(
        ToolCallEntry(call=ToolCall(id="a", name="read_file", arguments='{"path": "a.py"}'))
    )
    history.add(
        ToolCallEntry(call=ToolCall(id="b", name="read_file", arguments='{"path": "b.py"}'))
    )
    # Results arrive out of order; messages keep the order of the calls.
    history.add(ToolResultEntry(call_id="b", tool_name="read_file", content="B"))
    history.add(ToolResultEntry(call_id="a", tool_name="read_file", content="A"))
    history.add(AgentMessage(content="They differ."))

    units = history.units()
    assert [u.kind for u in units] == ["user", "assistant", "assistant"]
    assert [len(u.entries) for u in units] == [1, 6, 1]
    assert [u.pinned for u in units] == [True, False, False]
    messages = history.to_messages()
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c.id for c in messages[1].tool_calls] == ["a", "b"]
    assert [m.tool_call_id for m in messages[2:4]] == ["a", "b"]
    assert messages[2].name == "read_file"
    assert "I should read both" not in " ".join(m.content for m in messages)
    assert_consistent(history)


def test_thinking_is_kept_but_costs_no_prompt_tokens() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Hi."))
    before = history.token_count()
    history.add(AgentThinking(content="long thoughts " * 100))
    assert history.token_count() == before
    assert history.units()[-1].messages == ()
    assert isinstance(history.entries[-1], AgentThinking)


def test_pending_calls_are_left_out_of_the_messages_until_answered() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Run both."))
    history.add(ToolCallEntry(call=ToolCall(id="1", name="run_tests")))
    history.add(ToolCallEntry(call=ToolCall(id="2", name="run_tests")))
    assert [c.call_id for c in history.pending_calls()] == ["1", "2"]
    assert [m.role for m in history.to_messages()] == ["user"]
    assert_consistent(history)

    history.add(ToolResultEntry(call_id="2", tool_name="run_tests", content="passed"))
    assert [c.call_id for c in history.pending_calls()] == ["1"]
    messages = history.to_messages()
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert [c.id for c in messages[1].tool_calls] == ["2"]
    assert_consistent(history)

    history.add(
        ToolResultEntry(call_id="1", tool_name="run_tests", content="failed", is_error=True)
    )
    assert history.pending_calls() == []
    assert len(history.to_messages()) == 4
    assert_consistent(history)


def test_calls_left_unanswered_before_a_new_unit_are_never_sent() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Go."))
    history.add(AgentMessage(content="Trying."))
    history.add(ToolCallEntry(call=ToolCall(id="lost", name="search")))
    history.add(UserMessage(content="Never mind."))
    assert history.pending_calls() == []
    assert all(not m.tool_calls for m in history.to_messages())
    with pytest.raises(UserError, match="'lost'"):
        history.add(ToolResultEntry(call_id="lost", tool_name="search", content="late"))
    assert_consistent(history)


def test_a_result_for_an_unknown_call_raises_and_changes_nothing() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Go."))
    history.add(ToolCallEntry(call=ToolCall(id="known", name="search")))
    version, count = history.version, history.token_count()
    with pytest.raises(UserError, match="'ghost'"):
        history.add(ToolResultEntry(call_id="ghost", tool_name="search", content="?"))
    assert history.version == version
    assert history.token_count() == count
    assert len(history) == 2
    with pytest.raises(UserError, match="not a call of the current assistant turn"):
        History([ToolResultEntry(call_id="x", tool_name="t", content="")], counter=COUNTER)


def test_a_result_for_a_call_of_an_earlier_turn_raises() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Go."))
    turn(history, "first")
    history.add(AgentMessage(content="Next."))
    with pytest.raises(UserError, match="'first'"):
        history.add(ToolResultEntry(call_id="first", tool_name="read_file", content="again"))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (ToolResultEntry(call_id="c", tool_name="search", content="twice"), "already has a result"),
        (ToolResultEntry(call_id="d", tool_name="grep", content="?"), "names tool 'grep'"),
        (UserMessage(id="same", content="?"), "id 'same' is already"),
    ],
)
def test_entries_breaking_the_unit_rules_raise_user_errors(
    entry: HistoryEntry, message: str
) -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(id="same", content="Go."))
    history.add(ToolCallEntry(call=ToolCall(id="c", name="search")))
    history.add(ToolCallEntry(call=ToolCall(id="d", name="search")))
    history.add(ToolResultEntry(call_id="c", tool_name="search", content="once"))
    with pytest.raises(UserError, match=message):
        history.add(entry)
    assert_consistent(history)
    with pytest.raises(UserError, match=message):
        build_units([*history.entries, entry], COUNTER)


def test_a_call_id_repeated_within_one_turn_raises() -> None:
    history = History(
        [UserMessage(content="Go."), ToolCallEntry(call=ToolCall(id="d", name="a"))],
        counter=COUNTER,
    )
    with pytest.raises(UserError, match="reuses call id 'd'"):
        history.add(ToolCallEntry(call=ToolCall(id="d", name="b")))


def test_call_ids_may_repeat_across_turns() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Go."))
    turn(history, "call_0", "one")
    turn(history, "call_0", "two")
    assert len(history.units()) == 3
    assert_consistent(history)


def test_a_summary_is_sent_as_a_prefixed_user_message_and_is_pinned() -> None:
    history = History(counter=COUNTER)
    history.add(Summary(content="- User asked for X.", replaced_ids=("a",)))
    (unit,) = history.units()
    assert unit.kind == "summary"
    assert unit.pinned
    assert unit.messages == (
        ChatMessage(role="user", content=f"{SUMMARY_PREFIX}\n- User asked for X."),
    )


def test_only_the_first_user_message_is_pinned() -> None:
    history = History(counter=COUNTER)
    history.add(AgentMessage(content="Hello, how can I help?"))
    history.add(UserMessage(content="Task."))
    history.add(UserMessage(content="More."))
    assert [u.pinned for u in history.units()] == [False, True, False]


def test_the_default_counter_is_the_shared_tiktoken_counter() -> None:
    history = History()
    assert isinstance(history.counter, TiktokenCounter)
    assert history.counter.name == "tiktoken:cl100k_base"


def test_token_counts_match_tiktoken_on_a_realistic_turn() -> None:
    counter = TiktokenCounter()
    history = History(counter=counter)
    history.add(UserMessage(content="Find why test_parser fails on Windows line endings."))
    history.add(AgentMessage(content="I'll look at the tokenizer first."))
    history.add(
        ToolCallEntry(call=ToolCall(id="c1", name="read_file", arguments='{"path": "src/tok.py"}'))
    )
    history.add(
        ToolResultEntry(call_id="c1", tool_name="read_file", content="def split(s):\n  ...")
    )
    history.add(
        ToolCallEntry(call=ToolCall(id="c2", name="grep", arguments='{"pattern": "\\\\r\\\\n"}'))
    )
    assert history.token_count() + REPLY_PRIMING_TOKENS == counter.count_messages(
        history.to_messages()
    )
    assert_consistent(history)


def test_version_grows_with_every_change_only() -> None:
    history = History(counter=COUNTER)
    versions = [history.version]
    history.add(UserMessage(content="Go."))
    versions.append(history.version)
    turn(history, "c")
    versions.append(history.version)
    history.units()
    history.to_messages()
    assert history.version == versions[-1]
    assert versions == sorted(set(versions))


def test_entries_and_units_are_read_only_live_views() -> None:
    history = History([UserMessage(content="Go.")], counter=COUNTER)
    entries, units = history.entries, history.units()
    history.add(AgentMessage(content="Done."))
    assert len(entries) == 2
    assert len(units) == 2
    assert isinstance(entries[0:1], tuple)
    assert not hasattr(entries, "append")
    messages = history.to_messages()
    messages.clear()
    assert len(history.to_messages()) == 2


# -- invariants ----------------------------------------------------------------------------


@settings(max_examples=100)
@given(entries=entry_lists())
def test_adding_entries_one_by_one_keeps_every_cache_exact(entries: list[HistoryEntry]) -> None:
    history = History(counter=COUNTER)
    for entry in entries:
        history.add(entry)
        assert history.token_count() + REPLY_PRIMING_TOKENS == COUNTER.count_messages(
            history.to_messages()
        )
    assert_consistent(history)
    last = history.units()[-1] if entries else None
    pending = [c.call_id for c in history.pending_calls()]
    assert pending == ([c.call_id for c in last.pending] if last else [])


@st.composite
def add_prune_scripts(
    draw: st.DrawFn,
) -> list[tuple[list[HistoryEntry], tuple[PruningStrategy | SummarizeOldest, int] | None]]:
    """Entries cut at unit boundaries into chunks, each maybe followed by a pruning.

    A pruning is a sync strategy (`History.prune`) or a summarizing step (`History.fold`).
    """
    entries = draw(entry_lists(max_units=20))
    starts = [0]
    for unit in build_units(entries, COUNTER):
        starts.append(starts[-1] + len(unit.entries))
    cuts = sorted(set(draw(st.lists(st.sampled_from(starts), max_size=5))) | {0, len(entries)})
    script = []
    for begin, end in itertools.pairwise(cuts):
        pruner = st.one_of(pruning_strategies(), summarize_steps())
        prune = draw(st.none() | st.tuples(pruner, st.integers(0, 1500)))
        script.append((entries[begin:end], prune))
    return script


@settings(max_examples=120)
@given(script=add_prune_scripts())
def test_token_count_stays_exact_through_any_adds_and_prunes(
    script: list[tuple[list[HistoryEntry], tuple[PruningStrategy | SummarizeOldest, int] | None]],
) -> None:
    history = History(counter=COUNTER)
    for chunk, prune in script:
        history.extend(chunk)
        assert_consistent(history)
        if prune is not None:
            strategy, budget = prune
            version = history.version
            if isinstance(strategy, SummarizeOldest):
                report = asyncio.run(history.fold(strategy, budget))
            else:
                report = history.prune(strategy, budget)
            assert report.tokens_after == history.token_count()
            assert report.fits == (history.token_count() <= budget)
            assert history.version > version or not report.changed
            assert_consistent(history)


def test_entries_made_without_an_id_get_distinct_ids_of_32_hex_digits() -> None:
    ids = [UserMessage(content="hi").id for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(len(entry_id) == 32 and set(entry_id) <= set("0123456789abcdef") for entry_id in ids)


def test_entry_ids_do_not_repeat_when_the_random_module_is_seeded_again() -> None:
    import random

    random.seed(7)
    first = UserMessage(content="a")
    random.seed(7)
    second = UserMessage(content="a")
    assert first.id != second.id and len(first.id) == 32
