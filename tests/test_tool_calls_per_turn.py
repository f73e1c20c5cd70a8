"""One answer's tool calls run up to `AgentConfig.max_tool_calls_per_turn`; the rest are refused.

A model server that answers with thousands of tool calls (broken, or hostile) would have them
all started at once. The first `max_tool_calls_per_turn` run; every one past them gets an
error result the model reads (so the history stays whole: each call has its result), and the
run goes on. Driven through the real `openai` SDK against the scripted server.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_flow import AgentConfig, AgentExecutor
from agent_flow.events import ToolCallCompleted, ToolCallFailed, WarningRaised
from agent_flow.history import ToolResultEntry
from agent_flow.llm import OpenAIClient
from agent_flow.llm.base import LLMRequest
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import ToolExecutor, tool
from tests.openai_server import OpenAIServer, completion_body, json_reply


def _tools(ran: list[int]) -> ToolExecutor:
    @tool
    def note(n: int) -> str:
        """Note a number.

        Args:
            n: The number.
        """
        ran.append(n)
        return f"noted {n}"

    return ToolExecutor([note])


async def test_an_answer_with_more_calls_than_the_limit_runs_the_first_and_refuses_the_rest() -> (
    None
):
    ran: list[int] = []
    calls = [(f"call_{i}", "note", json.dumps({"n": i})) for i in range(70)]
    async with OpenAIServer() as server:
        server.script(
            json_reply(completion_body(tool_calls=calls)), json_reply(completion_body("done"))
        )
        llm = OpenAIClient("m", base_url=server.base_url, api_key="k", max_retries=0)
        try:
            agent = AgentExecutor(llm, stream=False, tools=_tools(ran))
            async with agent.subscribe() as events:
                outcome = await agent.run("note them")
                seen = [event async for event in events]
        finally:
            await llm.aclose()
    assert outcome.final_text == "done"
    assert sorted(ran) == list(range(64))
    results = [e for e in agent.history.entries if isinstance(e, ToolResultEntry)]
    assert [r.call_id for r in results] == [f"call_{i}" for i in range(70)]
    refused = [r for r in results if r.is_error]
    assert [r.call_id for r in refused] == [f"call_{i}" for i in range(64, 70)]
    assert all("at most 64 run in one turn" in r.content for r in refused)
    assert len([e for e in seen if isinstance(e, ToolCallCompleted)]) == 64
    assert len([e for e in seen if isinstance(e, ToolCallFailed)]) == 6
    (warning,) = [e for e in seen if isinstance(e, WarningRaised)]
    assert "70 tool calls" in warning.message
    # The second request carries every call's result, the refused ones included.
    second = server.requests[1].body["messages"]
    assert sum(1 for m in second if m["role"] == "tool") == 70


@settings(max_examples=20, deadline=None)
@given(limit=st.integers(1, 6), asked=st.integers(0, 9))
def test_exactly_the_first_limit_calls_run(limit: int, asked: int) -> None:
    ran: list[int] = []
    answers = [reply(tool_calls=[call("note", n=i) for i in range(asked)])] if asked else []

    def model(request: LLMRequest) -> Reply:
        return answers.pop() if answers else reply("done")

    agent = AgentExecutor(
        FunctionLLM(model), tools=_tools(ran), config=AgentConfig(max_tool_calls_per_turn=limit)
    )
    outcome = asyncio.run(agent.run("go"))
    assert outcome.final_text == "done"
    assert sorted(ran) == list(range(min(asked, limit)))
    results = [e for e in agent.history.entries if isinstance(e, ToolResultEntry)]
    assert len(results) == asked
    assert sum(r.is_error for r in results) == max(0, asked - limit)


def test_the_limit_is_at_least_one() -> None:
    with pytest.raises(ValidationError):
        AgentConfig(max_tool_calls_per_turn=0)
