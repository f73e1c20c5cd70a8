"""``max_cost_usd`` holds before each model call, the summarizer's included (agent/_cost.py).

Every call is admitted by its worst case (the counted prompt with the whole output allowance,
priced as the model asked for) against what the run spent; a call that could pass the limit
is never sent. Only a server that bills more than it was asked (a larger prompt count, a
pricier model answering) can pass the limit, by at most that one call's excess, which is
reported, and later calls are estimated as that server bills.

The wire tests run the real openai SDK against the scripted server (`tests/openai_server.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.agent._cost import _Billing
from agent_flow.config import AgentConfig, ContextConfig, Pricing
from agent_flow.events import AgentEvent, ContextBuilt, ModelResponded, WarningRaised
from agent_flow.history import DropOldest, ElideToolResults, SummarizeOldest, Summary
from agent_flow.llm import LLMSummarizer, OpenAIClient
from agent_flow.llm.base import LLMClient, LLMRequest, Usage
from agent_flow.llm.metering import ModelCallPlan
from agent_flow.pricing import price_usage
from agent_flow.testing import FunctionLLM, ScriptedReply, call, reply
from tests.helpers import add
from tests.openai_server import OpenAIServer, RecordedRequest, Reply, completion_body, json_reply

RESERVE = 1000


def _agent(llm: LLMClient, **settings: object) -> AgentExecutor:
    context = ContextConfig(max_tokens=6000, reserve_output_tokens=RESERVE, counter="approx")
    agent = AgentExecutor(
        llm,
        config=AgentConfig.model_validate(
            {"context": context, "control_tools": False, "max_iterations": 100, **settings}
        ),
        stream=False,
    )
    agent.tools.register(add)
    return agent


class _Watch:
    """The events of a run that the cost limit is judged by, in order."""

    def __init__(self, agent: AgentExecutor) -> None:
        self.built: list[ContextBuilt] = []
        self.responded: list[ModelResponded] = []
        self.warnings: list[WarningRaised] = []
        agent.events.on(("context_built", "model_responded", "warning_raised"), self._seen)

    def _seen(self, event: AgentEvent) -> None:
        if isinstance(event, ContextBuilt):
            self.built.append(event)
        elif isinstance(event, ModelResponded):
            self.responded.append(event)
        elif isinstance(event, WarningRaised):
            self.warnings.append(event)

    @property
    def cost_warnings(self) -> list[str]:
        return [w.message for w in self.warnings if w.source == "cost"]


def _tool_turn(
    turn: int, *, usage: tuple[int, int], model: str = "gpt-4o-mini", text: str = "working "
) -> Reply:
    return json_reply(
        completion_body(
            text * 20,
            tool_calls=[(f"c{turn}", "add", json.dumps({"a": turn, "b": 1}))],
            finish_reason="tool_calls",
            usage=usage,
            model=model,
        )
    )


@contextlib.asynccontextmanager
async def _wire(
    handler: Callable[[RecordedRequest], Reply],
) -> AsyncIterator[tuple[OpenAIServer, OpenAIClient]]:
    """The scripted server answering with `handler`, and a gpt-4o-mini client talking to it."""
    async with (
        OpenAIServer(handler=handler) as server,
        OpenAIClient("gpt-4o-mini", base_url=server.base_url, api_key="k") as client,
    ):
        yield server, client


def _mini(prompt: int, completion: int) -> float:
    cost = price_usage("gpt-4o-mini", Usage(prompt_tokens=prompt, completion_tokens=completion))
    assert cost is not None
    return cost


# -- a call that could pass the limit is never sent -------------------------------------


async def test_a_run_stops_before_the_call_that_could_pass_the_limit_and_never_sends_it() -> None:
    turns = 0

    def answer(request: RecordedRequest) -> Reply:
        nonlocal turns
        turns += 1
        return _tool_turn(turns, usage=(100, 10))  # billed far below its worst case

    async with _wire(answer) as (server, client):
        agent = _agent(client, max_cost_usd=0.002)
        watch = _Watch(agent)
        outcome = await agent.run("add numbers forever")
        sent = [request.body for request in server.requests]

    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert outcome.final_text.startswith("stopped before a model call that could cost $")
    assert "would pass max_cost_usd ($0.002)" in outcome.final_text
    # One prompt more was built than sent: the refused call's, which the server never saw.
    assert len(watch.built) == len(sent) + 1 >= 3
    assert [body["max_tokens"] for body in sent] == [RESERVE] * len(sent)
    spent = 0.0
    for built, responded in zip(watch.built, watch.responded, strict=False):
        assert spent + _mini(built.breakdown.total, RESERVE) <= 0.002
        assert responded.cost_usd is not None
        spent += responded.cost_usd
    refused = _mini(watch.built[-1].breakdown.total, RESERVE)
    assert spent + refused > 0.002
    assert outcome.cost_usd == pytest.approx(spent)
    assert watch.cost_warnings == []


async def test_a_limit_below_the_first_calls_worst_case_sends_nothing() -> None:
    async with _wire(lambda request: _tool_turn(1, usage=(10, 1))) as (server, client):
        outcome = await _agent(client, max_cost_usd=0.0005).run("add")
        assert server.requests == []
    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert outcome.cost_usd == 0


# -- the summarizer's calls are admitted the same way -----------------------------------


def _summarizing(agent_usage: tuple[int, int]) -> Callable[[RecordedRequest], Reply]:
    """Long tool turns for the agent; a summary for the summarizer's requests (no tools)."""
    turns = 0

    def answer(request: RecordedRequest) -> Reply:
        nonlocal turns
        if not request.body.get("tools"):
            return json_reply(
                completion_body("- the agent added numbers", usage=(2000, 40), model="gpt-4.1")
            )
        turns += 1
        return _tool_turn(turns, usage=agent_usage, text="step " * 20)

    return answer


def _summarize_with(agent: AgentExecutor, client: LLMClient, model: str) -> None:
    agent.context.strategy = SummarizeOldest(
        LLMSummarizer(client, counter=agent.context.counter, model=model),
        before=ElideToolResults(),
        after=DropOldest(),
    )


def _summarizer_requests(server: OpenAIServer) -> list[RecordedRequest]:
    return [request for request in server.requests if not request.body.get("tools")]


async def test_a_summarizer_call_that_could_pass_the_limit_is_never_sent() -> None:
    # Without a limit, the history outgrows its budget and the summarizer (on gpt-4.1, far
    # dearer than the agent's gpt-4o-mini) is asked after some agent calls.
    async with _wire(_summarizing((300, 100))) as (server, client):
        agent = _agent(client, max_iterations=20)
        _summarize_with(agent, client, "gpt-4.1")
        unlimited = _Watch(agent)
        await agent.run("add numbers")
        assert _summarizer_requests(server)
    sources = [e.source for e in unlimited.responded]
    before_summary = unlimited.responded[: sources.index("summarizer")]
    spent = sum(e.cost_usd or 0 for e in before_summary)
    # Room for the agent's calls (gpt-4o-mini, < $0.002 each at worst), not for a summary
    # (gpt-4.1: about 2,000 prompt tokens and 500 allowed, some $0.008).
    limit = spent + 0.002

    async with _wire(_summarizing((300, 100))) as (server, client):
        agent = _agent(client, max_cost_usd=limit)
        _summarize_with(agent, client, "gpt-4.1")
        watch = _Watch(agent)
        outcome = await agent.run("add numbers")
        assert _summarizer_requests(server) == []
        assert len(server.requests) == len(before_summary)

    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert outcome.final_text.startswith(
        "stopped before a model call of the summarizer that could cost $"
    )
    assert "priced as 'gpt-4.1'" in outcome.final_text
    assert [e.source for e in watch.responded] == ["agent"] * len(before_summary)
    assert not any(isinstance(entry, Summary) for entry in agent.history.entries)
    assert outcome.cost_usd == pytest.approx(spent)


@settings(max_examples=25)
@given(limit=st.floats(0.001, 0.05))
def test_the_summarizers_admitted_calls_keep_the_run_within_its_limit(limit: float) -> None:
    def answer(request: LLMRequest) -> ScriptedReply:
        if not request.tools:  # the summarizer's request, on gpt-4.1
            return reply("- the agent added numbers", usage=Usage(prompt_tokens=1500))
        turn = len(llm.requests)
        return reply(
            "step " * 200,
            tool_calls=[call("add", a=turn, b=2)],
            usage=Usage(prompt_tokens=300, completion_tokens=100),
        )

    llm = FunctionLLM(answer, model="gpt-4o-mini")
    agent = _agent(llm, max_cost_usd=limit)
    _summarize_with(agent, llm, "gpt-4.1")
    outcome = asyncio.run(agent.run("add numbers"))
    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert outcome.cost_usd is not None
    assert outcome.cost_usd <= limit


async def test_a_summarizer_on_an_unpriced_model_is_refused_under_a_limit() -> None:
    def answer(request: LLMRequest) -> ScriptedReply:
        if not request.tools:
            return reply("- a summary")
        return reply("step " * 200, tool_calls=[call("add", a=len(llm.requests), b=2)])

    llm = FunctionLLM(answer, model="gpt-4o-mini")
    agent = _agent(llm, max_cost_usd=1.0)
    agent.context.strategy = SummarizeOldest(
        LLMSummarizer(llm, counter=agent.context.counter, model="private-7b"),
        after=DropOldest(),
    )
    outcome = await agent.run("add")
    assert outcome.stop_reason is StopReason.ERROR
    assert "the model 'private-7b' has no known price" in outcome.final_text
    assert all(request.tools for request in llm.requests)  # no summary was asked for


# -- a server billing more than it was asked: one call's excess, reported ---------------


async def test_a_pricier_model_answering_passes_the_limit_by_that_call_alone() -> None:
    async with _wire(lambda r: _tool_turn(1, usage=(200, 50), model="gpt-4o")) as (server, client):
        agent = _agent(client, max_cost_usd=0.0008)
        watch = _Watch(agent)
        outcome = await agent.run("add")
        assert len(server.requests) == 1

    billed = price_usage("gpt-4o", Usage(prompt_tokens=200, completion_tokens=50))
    worst = _mini(watch.built[0].breakdown.total, RESERVE)
    assert billed is not None
    assert worst <= 0.0008 < billed  # admitted, then billed as gpt-4o past the limit
    assert outcome.cost_usd is not None
    assert outcome.cost_usd == pytest.approx(billed)
    assert outcome.cost_usd - 0.0008 <= billed - worst  # the one call's excess, no more
    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert outcome.final_text.startswith(
        f"the run cost ${billed:.6f}, ${billed - 0.0008:.6f} past max_cost_usd ($0.0008): the "
        "model server billed"
    )
    (warning,) = watch.cost_warnings
    assert "'gpt-4o' answered for 'gpt-4o-mini'" in warning
    assert f"estimated at most ${worst:.6f}" in warning


async def test_after_a_pricier_model_answered_later_calls_are_priced_as_it() -> None:
    async with _wire(lambda r: _tool_turn(1, usage=(200, 50), model="gpt-4o")) as (server, client):
        agent = _agent(client, max_cost_usd=0.005)
        watch = _Watch(agent)
        outcome = await agent.run("add")
        assert len(server.requests) == 1

    # The second call's worst case at gpt-4o-mini's price would fit; at gpt-4o's it does not.
    second = watch.built[1].breakdown.total
    assert outcome.cost_usd is not None
    assert outcome.cost_usd + _mini(second, RESERVE) <= 0.005
    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert "priced as 'gpt-4o', which answered it" in outcome.final_text
    assert len(watch.cost_warnings) == 1


async def test_a_server_counting_a_larger_prompt_passes_the_limit_by_that_call_alone() -> None:
    server_count = 20_000  # whatever was sent, the server bills a 20k-token prompt
    async with _wire(lambda r: _tool_turn(1, usage=(server_count, 10))) as (server, client):
        agent = _agent(client, max_cost_usd=0.002)
        watch = _Watch(agent)
        outcome = await agent.run("add")
        assert len(server.requests) == 1

    counted = watch.built[0].breakdown.total
    billed, worst = _mini(server_count, 10), _mini(counted, RESERVE)
    assert worst <= 0.002 < billed
    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert outcome.cost_usd is not None
    assert outcome.cost_usd == pytest.approx(billed)
    assert outcome.cost_usd - 0.002 <= billed - worst
    (warning,) = watch.cost_warnings
    assert f"it counted {server_count} prompt tokens where agent_flow counted {counted}" in warning


async def test_once_a_server_counted_more_later_calls_count_the_prompt_as_it_does() -> None:
    ratio = 3
    watch: _Watch | None = None

    def answer(request: LLMRequest) -> ScriptedReply:
        assert watch is not None
        counted = watch.built[-1].breakdown.total
        return reply(
            tool_calls=[call("add", a=len(watch.built), b=2)],
            usage=Usage(prompt_tokens=ratio * counted, completion_tokens=20),
        )

    llm = FunctionLLM(answer, model="gpt-4o-mini")
    limit = 0.004
    agent = _agent(llm, max_cost_usd=limit)
    watch = _Watch(agent)
    outcome = await agent.run("add forever")

    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert "as its server counts them" in outcome.final_text
    # The first call's unused allowance covered its tripled prompt; every later call was
    # estimated with its prompt tripled, so none passed its worst case.
    assert watch.cost_warnings == []
    assert outcome.cost_usd is not None
    assert outcome.cost_usd <= limit
    refused = watch.built[-1].breakdown.total
    assert outcome.cost_usd + _mini(ratio * refused, RESERVE) > limit
    # Counted as agent_flow counts it, the refused call would have been made.
    assert outcome.cost_usd + _mini(refused, RESERVE) <= limit


async def test_without_a_limit_nothing_is_estimated_or_warned() -> None:
    async with _wire(lambda r: _tool_turn(1, usage=(9000, 10), model="gpt-4o")) as (server, client):
        agent = _agent(client, max_iterations=3)
        watch = _Watch(agent)
        outcome = await agent.run("add")
        assert len(server.requests) == 3
    assert outcome.stop_reason is StopReason.MAX_ITERATIONS
    assert watch.cost_warnings == []


# -- the invariant, over random costs and limits ----------------------------------------

PRICES = Pricing(input_per_million=3.0, output_per_million=15.0)


def _run_priced(
    limit: float, billing: list[tuple[float, float]]
) -> tuple[list[float], list[float], float]:
    """Run an agent whose calls are billed by `billing` in turn: shares of the prompt counted
    and of the output allowed. Return each call's worst case before any learning (the counted
    prompt and the whole allowance), each call's cost, and the run's cost."""
    worst: list[float] = []
    costs: list[float] = []
    ratio = 1.0  # the most prompt tokens billed per counted token so far

    def answer(request: LLMRequest) -> ScriptedReply:
        nonlocal ratio
        prompt_share, completion_share = billing[len(worst) % len(billing)]
        counted, allowed = built[-1].breakdown.total, request.max_tokens
        assert allowed is not None
        worst.append(PRICES.cost(counted, allowed))
        usage = Usage(
            prompt_tokens=math.floor(counted * prompt_share),
            completion_tokens=math.floor(allowed * completion_share),
        )
        ratio = max(ratio, usage.prompt_tokens / counted)
        costs.append(PRICES.cost(usage.prompt_tokens, usage.completion_tokens))
        return reply(tool_calls=[call("add", a=len(worst), b=2)], usage=usage)

    agent = _agent(FunctionLLM(answer, model="private-7b"), max_cost_usd=limit, pricing=PRICES)
    built = _Watch(agent).built  # the prompt of each call, before the call
    outcome = asyncio.run(agent.run("add forever"))
    assert outcome.cost_usd is not None
    assert outcome.cost_usd == pytest.approx(sum(costs))
    if outcome.stop_reason is StopReason.COST_LIMIT and len(built) > len(worst):
        # Stopped at the first call it refused: that one could have passed the limit, its
        # prompt counted as the server bills prompts.
        refused = PRICES.cost(math.ceil(built[-1].breakdown.total * ratio), RESERVE)
        assert outcome.cost_usd + refused > limit - 1e-12
    else:  # stopped past the limit, or calls billed at nothing never reach it
        assert outcome.stop_reason in (StopReason.COST_LIMIT, StopReason.MAX_ITERATIONS)
    return worst, costs, outcome.cost_usd


def _admitted_within(limit: float, worst: list[float], costs: list[float]) -> bool:
    """Whether every call was made with spent-so-far plus its worst case within the limit."""
    return all(sum(costs[:k]) + worst[k] <= limit + 1e-12 for k in range(len(worst)))


@settings(max_examples=40)
@given(
    limit=st.floats(0.001, 0.2),
    billing=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=8),
)
def test_a_server_that_bills_what_it_was_asked_keeps_the_run_within_its_limit(
    limit: float, billing: list[tuple[float, float]]
) -> None:
    worst, costs, cost = _run_priced(limit, billing)
    assert _admitted_within(limit, worst, costs)
    assert cost <= limit + 1e-12


@settings(max_examples=30)
@given(limit=st.floats(0.001, 0.2))
def test_the_estimated_costs_of_the_calls_made_never_sum_past_the_limit(limit: float) -> None:
    # Each call billed exactly its worst case: what the run spent is the sum of the estimates.
    worst, _, cost = _run_priced(limit, [(1.0, 1.0)])
    assert sum(worst) == pytest.approx(cost)
    assert sum(worst) <= limit + 1e-12


@settings(max_examples=40)
@given(
    limit=st.floats(0.001, 0.2),
    billing=st.lists(st.tuples(st.floats(0, 4), st.floats(0, 1)), min_size=1, max_size=8),
)
def test_a_server_that_bills_more_passes_the_limit_by_one_calls_excess_at_most(
    limit: float, billing: list[tuple[float, float]]
) -> None:
    worst, costs, cost = _run_priced(limit, billing)
    assert _admitted_within(limit, worst, costs)
    if cost > limit:
        # Only the last call passed it, and by no more than it passed its worst case.
        assert cost - limit <= costs[-1] - worst[-1] + 1e-12


@given(
    counted=st.integers(0, 200_000),
    allowed=st.integers(1, 32_000),
    billed_prompt=st.integers(0, 800_000),
)
def test_a_call_billed_as_before_cannot_pass_its_worst_case_twice(
    counted: int, allowed: int, billed_prompt: int
) -> None:
    billing = _Billing()
    key = ("gpt-4o-mini", None)
    plan = ModelCallPlan(source="agent", prompt_tokens=counted, max_tokens=allowed)
    first = billing.worst_usage(key, plan)
    assert (first.prompt_tokens, first.completion_tokens) == (counted, allowed)
    billing.learn(key, plan, Usage(prompt_tokens=billed_prompt, completion_tokens=1), "gpt-4o")
    again = billing.worst_usage(key, plan)
    if counted > 0:
        assert again.prompt_tokens >= billed_prompt
    assert again.prompt_tokens >= counted  # never below what was counted
    assert billing.models(key) == ["gpt-4o-mini", "gpt-4o"]
