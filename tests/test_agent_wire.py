"""What an agent puts on the wire and counts: approvers, budgets, output reserve, usage.

Each test pins one behaviour of issue 9, section 4, through a real `AgentExecutor` run:

- agents sharing one `ToolExecutor` each get their own approver;
- in XML tool mode the prompt sent is the prompt budgeted;
- summarizer model calls count in the usage, the events and the limits;
- the request's ``max_tokens`` is the output reserve (capped by the configured limit);
- usage without a total still counts against ``max_total_tokens``.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import AgentEvent, ModelResponded
from agent_flow.llm import OpenAIClient
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.llm.config import LLMConfig
from agent_flow.messages import ChatMessage
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM, call, reply
from agent_flow.tokens import TiktokenCounter
from agent_flow.tools import (
    ApprovalCallback,
    ApprovalRequest,
    FunctionTool,
    RiskLevel,
    ToolExecutor,
    ToolPolicy,
    tool,
)
from tests.openai_server import OpenAIServer, RecordedRequest, completion_body, json_reply
from tests.openai_server import Reply as ServerReply


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def _config(**settings: object) -> AgentConfig:
    return AgentConfig.model_validate(
        {"context": ContextConfig(max_tokens=8000, counter="approx"), **settings}
    )


async def test_usage_without_a_total_counts_against_the_token_limit() -> None:
    usage = Usage(prompt_tokens=600, completion_tokens=100)  # a client that left total unset
    looping = FunctionLLM(lambda request: reply(tool_calls=[call("add", a=1, b=1)], usage=usage))
    agent = AgentExecutor(looping, config=_config(max_total_tokens=1500))
    agent.tools.register(add)

    outcome = await agent.run("add forever")

    assert (outcome.stop_reason, outcome.iterations) == (StopReason.TOKEN_LIMIT, 3)
    assert outcome.usage.total_tokens == 2100


@tool(policy=ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH))
def delete(path: str) -> str:
    """Delete a file.

    Args:
        path: The file.
    """
    return f"deleted {path}"


async def test_agents_sharing_a_tool_executor_each_get_their_own_approver() -> None:
    shared = ToolExecutor([delete])
    asked: dict[str, list[str]] = {"alice": [], "bob": []}
    both_waiting = asyncio.Event()

    def approver(user: str, answer: bool) -> ApprovalCallback:
        async def decide(request: ApprovalRequest) -> bool:
            asked[user].append(str(request.arguments["path"]))
            if sum(map(len, asked.values())) == 2:
                both_waiting.set()
            await both_waiting.wait()  # both agents wait for an answer at the same time
            return answer

        return decide

    def agent_for(user: str, answer: bool) -> AgentExecutor:
        llm = ScriptedLLM(
            [reply(tool_calls=[call("delete", path=f"{user}.txt")]), f"{user} is done"]
        )
        return AgentExecutor(
            llm, config=_config(), tools=shared, approval=approver(user, answer), stream=False
        )

    alice, bob = agent_for("alice", True), agent_for("bob", False)
    first, second = await asyncio.gather(alice.run("delete mine"), bob.run("delete mine"))

    assert asked == {"alice": ["alice.txt"], "bob": ["bob.txt"]}
    assert first.tool_uses[0].content == "deleted alice.txt"
    assert second.tool_uses[0].error_kind == "not_approved"
    assert shared.approval is None  # building an agent leaves the shared executor alone


@pytest.mark.parametrize(
    ("llm_limit", "allowed"),
    [(None, 700), (300, 300), (5000, 700)],
)
async def test_the_model_is_allowed_the_output_reserve_capped_by_the_configured_limit(
    llm_limit: int | None, allowed: int
) -> None:
    llm = ScriptedLLM([reply(tool_calls=[call("add", a=1, b=2)]), "3"])
    config = _config(
        context=ContextConfig(max_tokens=6000, reserve_output_tokens=700, counter="approx"),
        llm=LLMConfig(model="m", max_tokens=llm_limit),
    )
    agent = AgentExecutor(llm, config=config)
    agent.tools.register(add)

    await agent.run("add 1 and 2")

    assert [request.max_tokens for request in llm.requests] == [allowed, allowed]
    window = agent.context.max_tokens
    for request in llm.requests:
        prompt = agent.history.counter.count_messages(request.messages)
        prompt += agent.history.counter.count_tools(request.tools)
        assert request.max_tokens is not None
        assert prompt + request.max_tokens <= window  # never more than the window leaves


async def test_without_a_reserve_the_model_is_allowed_what_the_window_leaves() -> None:
    llm = ScriptedLLM(["done"])
    config = _config(
        context=ContextConfig(max_tokens=3000, reserve_output_tokens=0, counter="approx")
    )
    agent = AgentExecutor(llm, config=config)

    await agent.run("say done")

    (request,) = llm.requests
    sent = agent.history.counter.count_messages(request.messages)
    sent += agent.history.counter.count_tools(request.tools)
    assert request.max_tokens == 3000 - sent


AGENT_USAGE = Usage(prompt_tokens=100, completion_tokens=10)
SUMMARY_USAGE = Usage(prompt_tokens=3000, completion_tokens=40)


def _summarizing_agent(**settings: object) -> AgentExecutor:
    """An agent whose history outgrows its budget, pruned by summarizing with its model."""
    turns = 0

    def answer(request: LLMRequest) -> Reply:
        nonlocal turns
        if not request.tools:  # LLMSummarizer's request: it offers no tools
            return reply("- the agent added numbers", usage=SUMMARY_USAGE)
        turns += 1
        if turns > 16:
            return reply("done", usage=AGENT_USAGE)
        return reply("x " * 300, tool_calls=[call("add", a=turns, b=2)], usage=AGENT_USAGE)

    context = ContextConfig(
        max_tokens=2500, reserve_output_tokens=200, counter="approx", strategy="summarize"
    )
    agent = AgentExecutor(FunctionLLM(answer), config=_config(context=context, **settings))
    agent.tools.register(add)
    return agent


async def test_summarizer_calls_count_in_the_usage_and_the_events() -> None:
    agent = _summarizing_agent()
    events: list[AgentEvent] = []
    subscription = agent.subscribe()

    async def collect() -> None:
        events.extend([event async for event in subscription])

    reader = asyncio.create_task(collect())
    outcome = await agent.run("add numbers")
    await reader

    responded = [e for e in events if isinstance(e, ModelResponded)]
    by_summarizer = [e for e in responded if e.source == "summarizer"]
    by_agent = [e for e in responded if e.source == "agent"]
    assert outcome.stop_reason is StopReason.ANSWERED
    assert by_summarizer, "the history never needed summarizing; make the turns longer"
    assert len(by_agent) == outcome.iterations
    assert all(e.tool_calls == 0 for e in by_summarizer)
    assert {(e.prompt_tokens, e.completion_tokens) for e in by_summarizer} == {(3000, 40)}
    expected = Usage()
    for _ in by_agent:
        expected += AGENT_USAGE
    for _ in by_summarizer:
        expected += SUMMARY_USAGE
    assert outcome.usage == expected
    assert len(outcome.usage_per_call) == len(responded)


async def test_summarizer_calls_count_against_the_token_and_cost_limits() -> None:
    # Without the summarizer's tokens the run uses 17 * 110 = 1,870 tokens and finishes.
    outcome = await _summarizing_agent(max_total_tokens=2500).run("add numbers")
    assert outcome.stop_reason is StopReason.TOKEN_LIMIT
    assert outcome.iterations < 17

    pricing = {"input_per_million": 1000.0, "output_per_million": 1000.0}  # $0.001 a token
    outcome = await _summarizing_agent(max_cost_usd=2.5, pricing=pricing).run("add numbers")
    assert outcome.stop_reason is StopReason.COST_LIMIT
    assert outcome.iterations < 17


@tool
def fetch_page(url: str) -> str:
    """Fetch a web page.

    Args:
        url: The page.
    """
    return f"Contents of {url}: a short page."


def _documented_tool(index: int) -> FunctionTool:
    def lookup(
        key: str, limit: int = 10, offset: int = 0, sort: str = "name", descending: bool = False
    ) -> str:
        return key

    lookup.__doc__ = f"Look up records of kind {index}. " + "It reads the catalogue. " * 5
    return tool(lookup, name=f"lookup_{index}")


async def test_in_xml_tool_mode_the_prompt_sent_is_the_prompt_budgeted() -> None:
    turns = 0

    def model(request: RecordedRequest) -> ServerReply:
        nonlocal turns
        turns += 1
        if turns > 40:
            return json_reply(completion_body("All pages read."))
        block = json.dumps({"tool_name": "fetch_page", "arguments": {"url": f"/p{turns}"}})
        return json_reply(completion_body(f"Reading page {turns}.\n<tool>\n{block}\n</tool>"))

    async with OpenAIServer(handler=model) as server:
        llm = OpenAIClient("local", base_url=server.base_url, api_key="k", tool_mode="xml")
        context = ContextConfig(max_tokens=5000, reserve_output_tokens=500)
        agent = AgentExecutor(llm, config=_config(context=context, max_iterations=50), stream=False)
        agent.tools.register(fetch_page)
        for index in range(12):
            agent.tools.register(_documented_tool(index))
        try:
            outcome = await agent.run("Read pages /p1 to /p40 and tell me when you are done.")
        finally:
            await llm.aclose()

    assert outcome.final_text == "All pages read.", outcome
    counter = TiktokenCounter()
    sent = [
        counter.count_messages([ChatMessage(**message) for message in body["messages"]])
        for body in server.bodies
    ]
    assert len(sent) == 41
    assert max(sent) <= 5000 - 500, f"tokens sent per request: {sent}"
    assert all(
        body["max_tokens"] <= 5000 - count for body, count in zip(server.bodies, sent, strict=True)
    )
