"""A consistency check and a turn builder shared by the History tests."""

from __future__ import annotations

from agent_flow.history import (
    AgentMessage,
    History,
    ToolCallEntry,
    ToolResultEntry,
    build_units,
)
from agent_flow.messages import ToolCall
from agent_flow.testing import assert_units_intact
from agent_flow.tokens import REPLY_PRIMING_TOKENS, ApproxCounter

COUNTER = ApproxCounter()


def assert_consistent(history: History) -> None:
    """The caches agree with a full rebuild and with an independent recount."""
    messages = history.to_messages()
    counter = history.counter
    assert history.token_count() + REPLY_PRIMING_TOKENS == counter.count_messages(messages)
    assert list(history.units()) == build_units(history.entries, counter)
    assert messages == [m for u in history.units() for m in u.messages]
    assert list(history.entries) == [e for u in history.units() for e in u.entries]
    for unit in history.units():
        assert unit.tokens == sum(counter.count_message(m) for m in unit.messages)
        assert unit.message_tokens == tuple(counter.count_message(m) for m in unit.messages)
    units = list(history.units())
    assert list(history.pinned_indices()) == [i for i, u in enumerate(units) if u.pinned]
    assert history.pinned_token_count() == sum(u.tokens for u in units if u.pinned)
    assert_units_intact(history)


def turn(
    history: History, call_id: str, body: str = "contents", *, name: str = "read_file"
) -> None:
    history.add(AgentMessage(content=f"Calling {name}."))
    history.add(ToolCallEntry(call=ToolCall(id=call_id, name=name, arguments='{"path": "a.py"}')))
    history.add(ToolResultEntry(call_id=call_id, tool_name=name, content=body))
