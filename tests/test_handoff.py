"""Handoff: the router hands the conversation over, with a declared view of the history.

What the target sees is exactly the view (and the projection), the router's run ends with the
target's answer and a record of the handoff, a target that does not finish leaves the router
in charge, a handoff is its turn's only call, chains are bounded, and events, usage, limits
and cancellation work as for any delegation.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow import (
    AgentConfig,
    AgentExecutor,
    ContextConfig,
    Handoff,
    HandoffRecord,
    LastUnits,
    handoff_of,
)
from agent_flow._defaults import DEFAULT_MAX_HANDOFFS
from agent_flow.agent import StopReason
from agent_flow.errors import UserError
from agent_flow.events import AgentEvent, ModelResponded
from agent_flow.handoff import SummaryView, WholeConversation, complete_units
from agent_flow.history import (
    AgentMessage,
    History,
    HistoryEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
    build_units,
)
from agent_flow.llm import LLMSummarizer
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.messages import ToolCall
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM, call, reply
from agent_flow.tokens import ApproxCounter
from agent_flow.tools import tool

APPROX = ContextConfig(max_tokens=8000, counter="approx")
USED = Usage(prompt_tokens=100, completion_tokens=10)


def router_llm(*calls: ToolCall) -> FunctionLLM:
    """A router that chats once, then (on the second user message) makes `calls` in one turn."""

    def play(request: LLMRequest) -> Reply:
        users = [m for m in request.messages if m.role == "user"]
        if request.messages[-1].role == "tool":
            return reply("router answers itself", usage=USED)
        if len(users) < 2:
            return reply("Hello, how can I help?", usage=USED)
        return reply(tool_calls=list(calls), usage=USED)

    return FunctionLLM(play, model="router")


def transfer(target: str) -> ToolCall:
    return call(f"transfer_to_{target}", task="refund invoice 42")


class Seen:
    """A target model that keeps every request it got."""

    def __init__(self, answer: str = "refund done") -> None:
        self.requests: list[LLMRequest] = []
        self.answer = answer

    def __call__(self, request: LLMRequest) -> Reply:
        self.requests.append(request)
        return reply(self.answer, usage=USED)


def router(*handoffs: Handoff, calls: tuple[ToolCall, ...] = (), **config: Any) -> AgentExecutor:
    """A router offered `handoffs`, whose handing turn calls them all (or `calls`)."""
    turn = calls or tuple(transfer(h.target) for h in handoffs)
    agent = AgentExecutor(router_llm(*turn), config=AgentConfig(context=APPROX, **config))
    for handoff in handoffs:
        handoff.add_to(agent)
    return agent


async def send(agent: AgentExecutor, message: str) -> tuple[Any, list[AgentEvent]]:
    subscription = agent.subscribe()
    outcome = await agent.send(message)
    return outcome, [event async for event in subscription]


def conversation_texts(request: LLMRequest) -> list[tuple[str, str]]:
    """The request's messages after the system prompt, as (role, text)."""
    return [(m.role, str(m.content)) for m in request.messages if m.role != "system"]


async def test_the_target_sees_the_last_units_and_answers_for_the_router() -> None:
    seen = Seen()
    billing = Handoff(
        "billing", "Billing.", llm=FunctionLLM(seen, model="billing"), history=LastUnits(2)
    )
    agent = router(billing)
    await agent.run("hi, I am Ann")
    outcome, events = await send(agent, "I want a refund for invoice 42")
    assert outcome.stop_reason == StopReason.COMPLETED
    assert outcome.final_text == "refund done"
    (first,) = seen.requests
    # The last two units before the handing turn (the router's greeting, the new message),
    # then the router's instruction; not the first message, nor the handing turn's call.
    assert conversation_texts(first) == [
        ("assistant", "Hello, how can I help?"),
        ("user", "I want a refund for invoice 42"),
        ("user", "refund invoice 42"),
    ]
    assert "I am Ann" not in json.dumps(first.model_dump(mode="json"))
    assert not any(m.tool_calls for m in first.messages)
    # The record: to whom, the target's run, how it ended.
    record = handoff_of(outcome)
    assert record is not None
    assert record.target == "billing" and record.task == "refund invoice 42"
    assert record.stop_reason == StopReason.ANSWERED and record.text == "refund done"
    (use,) = outcome.tool_uses
    assert use.name == "transfer_to_billing" and use.content == "refund done"
    assert HandoffRecord.model_validate(use.data) == record
    # One run, one tree: the target's events, under the router's run id.
    child = [e for e in events if e.path]
    assert {e.path for e in child} == {(outcome.run_id,)}
    assert {e.run_id for e in child} == {record.run_id} != {outcome.run_id}
    assert child[0].kind == "run_started" and child[-1].kind == "run_finished"
    # Usage rolls up: the router's handing call and the target's.
    assert outcome.usage_per_call == (USED, USED)
    assert outcome.usage.total_tokens == 2 * USED.total_tokens
    assert record.usage_per_call == (USED,)


async def test_a_target_that_does_not_finish_leaves_the_router_in_charge() -> None:
    stuck = FunctionLLM(lambda r: reply(tool_calls=[call("nope")]), model="billing")
    billing = Handoff(
        "billing", "Billing.", llm=stuck, config=AgentConfig(max_iterations=2, context=APPROX)
    )
    agent = router(billing)
    await agent.run("hi")
    outcome = await agent.send("refund please")
    assert outcome.stop_reason == StopReason.ANSWERED
    assert outcome.final_text == "router answers itself"
    (use,) = outcome.tool_uses
    assert use.is_error and "max_iterations" in use.content
    failed = HandoffRecord.model_validate(use.data)
    assert failed.target == "billing" and failed.stop_reason == StopReason.MAX_ITERATIONS
    assert handoff_of(outcome) is None  # no target took over


async def test_two_handoffs_in_one_turn_are_both_refused() -> None:
    seen_a, seen_b = Seen(), Seen()
    a = Handoff("billing", "Billing.", llm=FunctionLLM(seen_a))
    b = Handoff("support", "Support.", llm=FunctionLLM(seen_b))
    agent = router(a, b)
    await agent.run("hi")
    outcome = await agent.send("help")
    assert outcome.final_text == "router answers itself"
    assert seen_a.requests == [] and seen_b.requests == []
    assert [u.name for u in outcome.tool_uses] == ["transfer_to_billing", "transfer_to_support"]
    for use in outcome.tool_uses:
        assert use.is_error and "must be the only call of its turn" in use.content
        assert "transfer_to_billing" in use.content and "transfer_to_support" in use.content
    assert handoff_of(outcome) is None


async def test_a_handoff_beside_another_call_is_refused_and_the_other_call_runs() -> None:
    looked: list[str] = []

    @tool
    def lookup(invoice: str) -> str:
        """Look an invoice up.

        Args:
            invoice: Its number.
        """
        looked.append(invoice)
        return f"invoice {invoice}: paid twice"

    seen = Seen()
    billing = Handoff("billing", "Billing.", llm=FunctionLLM(seen))
    agent = router(billing, calls=(call("lookup", invoice="42"), transfer("billing")))
    agent.tools.register(lookup)
    await agent.run("hi")
    outcome = await agent.send("refund please")
    assert looked == ["42"] and seen.requests == []
    first, second = outcome.tool_uses
    assert not first.is_error and first.content == "invoice 42: paid twice"
    assert second.is_error and "['lookup', 'transfer_to_billing']" in second.content
    assert outcome.final_text == "router answers itself"


async def test_a_summary_view_gives_the_target_one_summary_of_the_conversation() -> None:
    seen = Seen()
    billing = Handoff(
        "billing", "Billing.", llm=FunctionLLM(seen), history=SummaryView(max_tokens=200)
    )
    agent = router(billing)
    await agent.run("hi, my name is Ann and my invoice number is 42")
    await agent.send("please refund it")
    (first,) = seen.requests
    users = [text for role, text in conversation_texts(first) if role == "user"]
    assert len(users) == 2  # the summary, then the instruction
    assert "Ann" in users[0] and users[-1] == "refund invoice 42"


async def test_a_model_summary_is_made_for_the_target_and_counted_as_the_routers() -> None:
    summary_model = ScriptedLLM([reply("- Ann wants invoice 42 refunded", usage=USED)])
    seen = Seen()
    billing = Handoff(
        "billing",
        "Billing.",
        llm=FunctionLLM(seen),
        history=SummaryView(LLMSummarizer(summary_model, counter=ApproxCounter())),
    )
    agent = router(billing)
    await agent.run("hi, my name is Ann")
    outcome, events = await send(agent, "please refund invoice 42")
    (asked,) = summary_model.requests
    transcript = json.dumps(asked.model_dump(mode="json"))
    assert "my name is Ann" in transcript and "please refund invoice 42" in transcript
    (first,) = seen.requests
    assert conversation_texts(first) == [
        ("user", "[Summary of earlier conversation]\n- Ann wants invoice 42 refunded"),
        ("user", "refund invoice 42"),
    ]
    # The router's handing call, the summary, the target's answer.
    assert outcome.usage_per_call == (USED, USED, USED)
    sources = [e.source for e in events if isinstance(e, ModelResponded) and not e.path]
    assert sources == ["agent", "summarizer"]


async def test_the_routers_token_limit_covers_the_target() -> None:
    greedy = FunctionLLM(
        lambda r: reply(tool_calls=[call("nope")], usage=Usage(prompt_tokens=400)),
        model="billing",
    )
    billing = Handoff("billing", "Billing.", llm=greedy)
    agent = router(billing, max_total_tokens=2000)
    await agent.run("hi")
    outcome = await agent.send("refund please")
    (use,) = outcome.tool_uses
    assert use.is_error and "token_limit" in use.content
    assert outcome.stop_reason == StopReason.TOKEN_LIMIT
    # The target stopped as soon as the router's total reached the limit.
    assert 2000 <= outcome.usage.total_tokens < 2400


async def test_cancelling_the_router_cancels_the_target() -> None:
    started = asyncio.Event()

    async def slow(request: LLMRequest) -> Reply:
        started.set()
        await asyncio.sleep(30)
        return reply("late")

    billing = Handoff("billing", "Billing.", llm=FunctionLLM(slow), history=WholeConversation())
    agent = router(billing)
    await agent.run("hi")
    running = asyncio.ensure_future(agent.send("refund"))
    await asyncio.wait_for(started.wait(), 10)
    agent.cancel()
    outcome = await asyncio.wait_for(running, 10)
    assert outcome.stop_reason == StopReason.CANCELLED


async def test_a_target_can_hand_over_again_and_the_last_one_answers() -> None:
    seen = Seen("support answers")
    support = Handoff("support", "Support.", llm=FunctionLLM(seen), history=LastUnits(1))
    relay = FunctionLLM(lambda r: reply(tool_calls=[call("transfer_to_support", task="help")]))
    billing = Handoff("billing", "Billing.", llm=relay, tools=[support])
    agent = router(billing)
    await agent.run("hi")
    outcome, events = await send(agent, "refund please")
    assert outcome.stop_reason == StopReason.COMPLETED
    assert outcome.final_text == "support answers"
    record = handoff_of(outcome)
    assert record is not None and record.target == "billing"
    # Support sees billing's last unit (billing's instruction), then its own.
    assert conversation_texts(seen.requests[0]) == [
        ("user", "refund invoice 42"),
        ("user", "help"),
    ]
    paths = {e.path for e in events if e.kind == "run_started"}
    assert paths == {(), (outcome.run_id,), (outcome.run_id, record.run_id)}


def ping_pong(max_handoffs: int | None) -> tuple[Handoff, Handoff, list[str]]:
    """Two agents that hand the conversation to each other until refused, then answer."""
    answered: list[str] = []

    def agent_llm(me: str, other: str) -> FunctionLLM:
        def play(request: LLMRequest) -> Reply:
            if request.messages[-1].role == "tool":
                answered.append(me)
                return reply(f"{me} answers: {request.messages[-1].content}")
            return reply(tool_calls=[call(f"transfer_to_{other}", task=f"from {me}")])

        return FunctionLLM(play)

    bound = {} if max_handoffs is None else {"max_handoffs": max_handoffs}
    a = Handoff("a", "A.", llm=agent_llm("a", "b"), **bound)
    b = Handoff("b", "B.", llm=agent_llm("b", "a"), **bound)
    a.tools.register(b)
    b.tools.register(a)
    return a, b, answered


@pytest.mark.parametrize("bound", [3, None])
async def test_agents_handing_back_and_forth_stop_at_max_handoffs(bound: int | None) -> None:
    a, _, answered = ping_pong(bound)
    limit = bound if bound is not None else DEFAULT_MAX_HANDOFFS
    agent = router(a)
    await agent.run("hi")
    outcome, events = await send(agent, "go")
    assert outcome.stop_reason == StopReason.COMPLETED
    # The last target in the chain was refused, told why, and answered itself.
    assert len(answered) == 1
    assert outcome.final_text.startswith(f"{answered[0]} answers: the conversation was handed")
    assert f"handed over {limit} times" in outcome.final_text
    assert f"max_handoffs={limit}" in outcome.final_text
    assert " -> ".join(["a", "b", "a", "b", "a"][:limit]) in outcome.final_text
    deepest = max(len(e.path) for e in events)
    assert deepest == limit


def test_max_handoffs_must_be_positive() -> None:
    with pytest.raises(UserError, match="max_handoffs must be at least 1, got 0"):
        Handoff("a", "A.", llm=ScriptedLLM([]), max_handoffs=0)


async def test_a_run_without_a_handoff_has_no_handoff_record() -> None:
    agent = AgentExecutor(ScriptedLLM(["hi"]), config=AgentConfig(context=APPROX))
    assert handoff_of(await agent.run("hello")) is None


# -- the view, whatever the conversation ---------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[HistoryEntry]:
    """A conversation of user turns, answers and tool calls with their results.

    Every entry's text holds a marker of its own (``M<k>X``), to look for in a prompt.
    """
    entries: list[HistoryEntry] = [UserMessage(content="first words M0X")]
    for turn in range(1, draw(st.integers(0, 7)) + 1):
        shape = draw(st.sampled_from(["answer", "tools", "user"]))
        if shape == "user":
            entries.append(UserMessage(content=f"user M{turn}X"))
        elif shape == "answer":
            entries.append(AgentMessage(content=f"answer M{turn}X"))
        else:
            calls = draw(st.integers(1, 3))
            ids = [f"c{turn}_{k}" for k in range(calls)]
            entries += [
                ToolCallEntry(
                    call=ToolCall(id=i, name="look", arguments=json.dumps({"q": f"M{turn}X"}))
                )
                for i in ids
            ]
            entries += [
                ToolResultEntry(call_id=i, tool_name="look", content=f"r M{turn}X") for i in ids
            ]
    return entries


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=conversations(), n=st.integers(1, 8))
async def test_last_units_is_exactly_the_last_n_complete_units(
    entries: list[HistoryEntry], n: int
) -> None:
    history = History(counter=None)
    entries = [*entries, UserMessage(content="please hand me over")]
    history.extend(entries)
    # The handing turn: the model's call, still without its result.
    history.add(ToolCallEntry(call=ToolCall(id="h", name="transfer_to_x", arguments="{}")))

    conversation = complete_units(history)
    assert [e.id for e in conversation] == [e.id for e in entries]
    view = await LastUnits(n).entries(conversation)
    units = history.units()[:-1]
    expected = [e for unit in units[-n:] for e in unit.entries]
    assert [e.id for e in view] == [e.id for e in expected]
    # A tool call is never without its result, nor a result without its call.
    calls = {e.call.id for e in view if isinstance(e, ToolCallEntry)}
    results = {e.call_id for e in view if isinstance(e, ToolResultEntry)}
    assert calls == results
    fresh = History(counter=None)
    fresh.extend(view)  # a valid history on its own


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=conversations(), n=st.integers(1, 8))
async def test_the_targets_prompt_holds_the_last_n_units_and_nothing_else_of_the_conversation(
    entries: list[HistoryEntry], n: int
) -> None:
    seen = Seen()
    billing = Handoff("billing", "Billing.", llm=FunctionLLM(seen), history=LastUnits(n))
    agent = AgentExecutor(
        ScriptedLLM([reply(tool_calls=[transfer("billing")])]),
        config=AgentConfig(context=APPROX),
        history=History(counter=None),
    )
    agent.history.extend(entries)
    billing.add_to(agent)
    outcome = await agent.run("hand me over MLASTX")
    assert outcome.final_text == "refund done"

    (request,) = seen.requests
    said = [*entries, UserMessage(content="hand me over MLASTX")]
    units = build_units(said, ApproxCounter())
    shown = units[-n:]
    expected = [m for unit in shown for m in unit.messages]
    sent = [m for m in request.messages if m.role != "system"]
    assert [(m.role, m.content, m.tool_calls) for m in sent[:-1]] == [
        (m.role, m.content, m.tool_calls) for m in expected
    ]
    assert (sent[-1].role, sent[-1].content) == ("user", "refund invoice 42")
    # No marker of a unit left out reaches the target, in any part of its request.
    wire = json.dumps(request.model_dump(mode="json"))
    hidden = [e.model_dump_json() for unit in units[:-n] for e in unit.entries]
    for marker in re.findall(r"M\d+X", " ".join(hidden)):
        assert marker not in wire
