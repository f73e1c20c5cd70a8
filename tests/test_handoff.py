"""Handoff: the router hands the conversation over, with a declared view of the history.

What the target sees is exactly the view (and the projection), the router's run ends with the
target's answer, a target that does not finish leaves the router in charge, one handoff per
turn, events, usage and cancellation as for any delegation.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Handoff, LastUnits
from agent_flow.agent import StopReason
from agent_flow.handoff import SummaryView, WholeConversation, complete_units
from agent_flow.history import AgentMessage, History, ToolCallEntry, ToolResultEntry, UserMessage
from agent_flow.llm.base import LLMRequest
from agent_flow.messages import ToolCall
from agent_flow.testing import FunctionLLM, Reply, call, reply

APPROX = ContextConfig(max_tokens=8000, counter="approx")


def router_llm(*transfers: str) -> FunctionLLM:
    """A router that chats once, then (on the second message) hands over."""

    def play(request: LLMRequest) -> Reply:
        users = [m for m in request.messages if m.role == "user"]
        if request.messages[-1].role == "tool":
            return reply("router answers itself")
        if len(users) < 2:
            return reply("Hello, how can I help?")
        return reply(
            tool_calls=[call(f"transfer_to_{t}", task="refund invoice 42") for t in transfers]
        )

    return FunctionLLM(play, model="router")


class Seen:
    """A target model that keeps every request it got."""

    def __init__(self, answer: str = "refund done") -> None:
        self.requests: list[LLMRequest] = []
        self.answer = answer

    def __call__(self, request: LLMRequest) -> Reply:
        self.requests.append(request)
        return reply(self.answer)


def router(*handoffs: Handoff) -> AgentExecutor:
    agent = AgentExecutor(
        router_llm(*(h.target for h in handoffs)), config=AgentConfig(context=APPROX)
    )
    for handoff in handoffs:
        handoff.add_to(agent)
    return agent


async def test_the_target_sees_the_last_units_and_answers_for_the_router() -> None:
    seen = Seen()
    billing = Handoff(
        "billing", "Billing.", llm=FunctionLLM(seen, model="billing"), history=LastUnits(2)
    )
    agent = router(billing)
    await agent.run("hi, I am Ann")
    events = []
    subscription = agent.subscribe()
    outcome = await agent.send("I want a refund for invoice 42")
    events = [event async for event in subscription]
    assert outcome.stop_reason == StopReason.COMPLETED
    assert outcome.final_text == "refund done"
    (first,) = seen.requests
    texts = [str(m.content) for m in first.messages if m.role in ("user", "assistant")]
    # The last two units before the handing turn: the router's greeting and the new message;
    # not the first message, nor the handing turn's tool call.
    assert "Hello, how can I help?" in texts
    assert "I want a refund for invoice 42" in texts
    assert not any("I am Ann" in t for t in texts)
    assert texts[-1] == "refund invoice 42"  # the router's instruction comes last
    assert not any(m.tool_calls for m in first.messages if m.role == "assistant")
    # One run, one tree.
    child = [e for e in events if e.path]
    assert child and child[0].kind == "run_started" and child[-1].kind == "run_finished"
    assert len(outcome.usage_per_call) == 2  # the router's handing call and the target's
    (use,) = outcome.tool_uses
    assert use.name == "transfer_to_billing" and use.content == "refund done"


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


async def test_a_turn_may_hand_over_only_once() -> None:
    seen_a, seen_b = Seen(), Seen()
    a = Handoff("billing", "Billing.", llm=FunctionLLM(seen_a))
    b = Handoff("support", "Support.", llm=FunctionLLM(seen_b))
    agent = router(a, b)
    await agent.run("hi")
    outcome = await agent.send("help")
    assert outcome.final_text == "router answers itself"
    assert seen_a.requests == [] and seen_b.requests == []
    assert all(u.is_error and "once" in u.content for u in outcome.tool_uses)


async def test_a_summary_view_gives_the_target_one_summary_of_the_conversation() -> None:
    seen = Seen()
    billing = Handoff(
        "billing", "Billing.", llm=FunctionLLM(seen), history=SummaryView(max_tokens=200)
    )
    agent = router(billing)
    await agent.run("hi, my name is Ann and my invoice number is 42")
    await agent.send("please refund it")
    (first,) = seen.requests
    users = [str(m.content) for m in first.messages if m.role == "user"]
    assert len(users) == 2  # the summary, then the instruction
    assert "Ann" in users[0] and users[-1] == "refund invoice 42"


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


# -- the view, whatever the conversation ---------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[Any]:
    """A conversation of user turns, answers and tool calls with their results."""
    entries: list[Any] = [UserMessage(content="first words")]
    for turn in range(draw(st.integers(0, 6))):
        shape = draw(st.sampled_from(["answer", "tools", "user"]))
        if shape == "user":
            entries.append(UserMessage(content=f"user {turn}"))
        elif shape == "answer":
            entries.append(AgentMessage(content=f"answer {turn}"))
        else:
            calls = draw(st.integers(1, 3))
            ids = [f"c{turn}_{k}" for k in range(calls)]
            entries += [
                ToolCallEntry(call=ToolCall(id=i, name="look", arguments="{}")) for i in ids
            ]
            entries += [ToolResultEntry(call_id=i, tool_name="look", content=f"r {i}") for i in ids]
    return entries


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=conversations(), n=st.integers(1, 8))
async def test_last_units_is_exactly_the_last_n_complete_units(entries: list[Any], n: int) -> None:
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


async def test_a_summary_views_model_calls_count_in_the_routers_run() -> None:
    """A `SummaryView` whose summarizer asks a model does it for the router's run: the call is
    in its usage and its events (source ``summarizer``), as a pruning summary's is."""
    from agent_flow.events import ModelResponded
    from agent_flow.llm.base import Usage
    from agent_flow.llm.summarizer import LLMSummarizer
    from agent_flow.tokens import ApproxCounter

    summary_usage = Usage(prompt_tokens=321, completion_tokens=12)
    summaries = FunctionLLM(
        lambda request: reply("Ann wants invoice 42 refunded.", usage=summary_usage),
        model="summaries",
    )
    view = SummaryView(LLMSummarizer(summaries, counter=ApproxCounter()), max_tokens=200)
    billing = Handoff("billing", "Billing.", llm=FunctionLLM(Seen()), history=view)
    agent = router(billing)
    await agent.run("hi, my name is Ann and my invoice number is 42")
    subscription = agent.subscribe()
    events: list[object] = []

    async def collect() -> None:
        events.extend([event async for event in subscription])

    reader = asyncio.create_task(collect())
    outcome = await agent.send("please refund it")
    await reader
    by_summarizer = [
        e for e in events if isinstance(e, ModelResponded) and e.source == "summarizer"
    ]
    assert [(e.prompt_tokens, e.completion_tokens) for e in by_summarizer] == [(321, 12)]
    assert summary_usage in outcome.usage_per_call
    assert outcome.usage.prompt_tokens >= 321


async def test_the_default_summary_counts_with_the_routers_counter() -> None:
    """`SummaryView()`'s extractive summary is budgeted in the router's tokens (here the
    approximate counter's), not with a tokenizer of its own (which, for an ``o200k_base``
    router, loaded ``cl100k_base`` besides)."""
    from agent_flow.history import ExtractiveSummarizer
    from agent_flow.tokens import ApproxCounter, TiktokenCounter

    seen = Seen()
    billing = Handoff(
        "billing", "Billing.", llm=FunctionLLM(seen), history=SummaryView(max_tokens=60)
    )
    agent = router(billing)  # counts approximately (APPROX)
    await agent.run("你好我叫安我的发票号码是四十二我想退款因为商品坏了。" * 3)
    await agent.send("请退款。")
    conversation = agent.history.entries[:2]  # the first message and the router's answer
    approx = await ExtractiveSummarizer(counter=ApproxCounter()).summarize(
        conversation, max_tokens=60
    )
    exact = await ExtractiveSummarizer(counter=TiktokenCounter()).summarize(
        conversation, max_tokens=60
    )
    assert approx != exact  # the two budgets keep different text
    (first,) = seen.requests
    summary = next(str(m.content) for m in first.messages if m.role == "user")
    assert approx in summary
