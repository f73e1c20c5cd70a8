"""Reading a run input (agent_flow/server/_agui_input.py): whatever messages a client sends, a
new thread's history keeps every call with exactly one result, the trailing messages are the
run's, and only a clear yes approves."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from ag_ui.core import RunAgentInput
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow._unicode import is_clean
from agent_flow.history import History, ToolCallEntry, ToolResultEntry
from agent_flow.history import UserMessage as UserEntry
from agent_flow.server._agui_input import read_approval, read_turn, seed_entries
from agent_flow.testing import assert_units_intact
from agent_flow.tokens import ApproxCounter

_IDS = st.sampled_from(["a", "b", "c", "d"])
_TEXT = st.text(alphabet="xyz ", max_size=6)


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


_MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, _TEXT),
    st.builds(lambda t: {"role": "system", "content": t}, _TEXT),
    st.builds(
        lambda t, ids: {
            "role": "assistant",
            "content": t or None,
            "toolCalls": [_call(i) for i in ids],
        },
        _TEXT,
        st.lists(_IDS, max_size=3),
    ),
    st.builds(
        lambda i, t, e: {"role": "tool", "toolCallId": i, "content": t, "error": e},
        _IDS,
        _TEXT,
        st.one_of(st.none(), _TEXT),
    ),
)


def _input(messages: list[dict[str, Any]]) -> RunAgentInput:
    numbered = [{"id": f"m{i}", **m} for i, m in enumerate(messages)]
    return RunAgentInput.model_validate(
        {"threadId": "t", "runId": "r", "messages": numbered, "tools": [], "context": []}
    )


@settings(max_examples=200)
@given(messages=st.lists(_MESSAGE, min_size=1, max_size=10))
def test_any_messages_seed_a_history_whose_calls_each_have_one_result(
    messages: list[dict[str, Any]],
) -> None:
    run_input = _input(messages)
    entries = seed_entries(run_input.messages)
    history = History(counter=ApproxCounter())
    for entry in entries:
        history.add(entry)  # refuses a result without its call, or a call twice
    assert_units_intact(history)
    assert history.pending_calls() == []
    calls = [e.call_id for e in entries if isinstance(e, ToolCallEntry)]
    results = [e.call_id for e in entries if isinstance(e, ToolResultEntry)]
    assert sorted(calls) == sorted(results) and len(set(calls)) == len(calls)
    users = [e.content for e in entries if isinstance(e, UserEntry)]
    assert users == [m["content"] for m in messages if m["role"] == "user" and m["content"]]


@settings(max_examples=200)
@given(messages=st.lists(_MESSAGE, min_size=1, max_size=10))
def test_the_messages_after_the_last_assistant_message_are_the_runs(
    messages: list[dict[str, Any]],
) -> None:
    turn = read_turn(_input(messages))
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    tail = messages[last + 1 :]
    texts = [m["content"] for m in tail if m["role"] == "user" and m["content"]]
    assert turn.text == ("\n\n".join(texts) or None)
    tools = {m["toolCallId"]: m for m in tail if m["role"] == "tool"}
    assert set(turn.results) == set(tools)
    for call_id, result in turn.results.items():
        assert result.is_error == (tools[call_id]["error"] is not None)
    # The seed is everything but the new message.
    assert len(turn.seed) == len(messages) - sum(1 for m in tail if m["role"] == "user")


@given(
    value=st.one_of(
        st.booleans(),
        st.dictionaries(st.sampled_from(["approved", "reason"]), st.one_of(st.booleans(), _TEXT)),
        st.integers(),
        _TEXT,
    )
)
def test_only_a_clear_yes_approves(value: Any) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    answer = read_approval(text)
    clear_yes = value is True or (isinstance(value, dict) and value.get("approved") is True)
    assert answer.approved is clear_yes


@given(
    reason=st.lists(
        st.sampled_from(["\ud800", "\udcff", "\ud83d\ude00", "a", "é"]) | st.characters(),
        max_size=30,
    ).map("".join)
)
def test_a_reason_from_any_escapes_can_be_written(reason: str) -> None:
    """An escape in the answer's JSON may make a lone surrogate (``"\\udcff"``); the reason is
    mended, so the answer (and the event that carries it) can still be written as JSON."""
    text = json.dumps({"approved": False, "reason": reason})  # escapes every non-ASCII char
    answer = read_approval(text)
    assert answer.approved is False
    answer.model_dump_json()  # raised UnicodeEncodeError for a lone surrogate before
    if is_clean(reason):
        assert answer.reason == reason[:500]
