from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig, Pricing, Skill
from agent_flow.errors import (
    ModelAuthenticationError,
    ModelConnectionError,
    OutputValidationError,
)
from agent_flow.events import AgentEvent, event_from_json, event_to_json
from agent_flow.llm import OpenAIClient
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.testing import FunctionLLM, ScriptedLLM, call, fail, reply
from agent_flow.tools import ToolContext, tool
from tests import helpers
from tests.helpers import add, assert_history_consistent
from tests.openai_server import (
    OpenAIServer,
    completion_body,
    error_reply,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)


@tool
async def note_fact(fact: str, context: ToolContext) -> str:
    """Remember a fact in the environment.

    Args:
        fact: The fact.
    """
    assert context.environment is not None
    context.environment.set("/knowledge/discovered_facts/-", fact)
    return "noted"


release = asyncio.Event()


@tool
async def slow(seconds: float) -> str:
    """Wait for a while.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "slept"


def make_agent(llm: Any, **config: Any) -> AgentExecutor:
    return helpers.make_agent(llm, note_fact, slow, **config)


async def run_collecting(agent: AgentExecutor, task: str) -> tuple[Any, list[AgentEvent]]:
    subscription = agent.subscribe()

    async def collect() -> list[AgentEvent]:
        return [event async for event in subscription]

    reader = asyncio.create_task(collect())
    outcome = await agent.run(task)
    return outcome, await reader


async def test_multi_step_tool_use_updates_the_environment_and_ends_with_completion() -> None:
    llm = ScriptedLLM(
        [
            reply("Noting.", tool_calls=[call("note_fact", fact="sky is blue")]),
            reply(tool_calls=[call("add", a=2, b=3)]),
            reply(tool_calls=[call("task_completion", summary="done: 5", result=5)]),
        ]
    )
    agent = make_agent(llm)
    outcome, events = await run_collecting(agent, "note and add")
    llm.assert_all_consumed()
    assert outcome.stop_reason is StopReason.COMPLETED
    assert (outcome.final_text, outcome.output, outcome.iterations) == ("done: 5", 5, 3)
    assert agent.environment.knowledge.discovered_facts == ["sky is blue"]
    assert agent.environment.task.status == "completed"
    assert [u.content for u in outcome.tool_uses][:2] == ["noted", "5"]
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert [e.seq for e in events] == list(range(len(events)))
    updates = [e for e in events if e.kind == "environment_updated"]
    assert any(
        c.pointer.startswith("/knowledge/discovered_facts") for u in updates for c in u.changes
    )
    for event in events:
        assert event_from_json(event_to_json(event)) == event
    # The model saw the tool result of step 1 in its second prompt.
    second = llm.requests[1].messages
    assert second[-1].role == "tool" and second[-1].content == "noted"
    assert "sky is blue" in second[0].content  # the environment, rendered


async def test_parallel_calls_run_concurrently_and_results_keep_call_order() -> None:
    llm = ScriptedLLM(
        [
            reply(
                tool_calls=[
                    call("slow", seconds=0.05),
                    call("add", a=1, b=1),
                    call("slow", seconds=0.05),
                ]
            ),
            "All three done.",
        ]
    )
    agent = make_agent(llm)
    outcome = await agent.run("go")
    assert outcome.stop_reason is StopReason.ANSWERED
    assert [u.content for u in outcome.tool_uses] == ["slept", "2", "slept"]
    tool_messages = [m for m in llm.requests[1].messages if m.role == "tool"]
    assert [m.content for m in tool_messages] == ["slept", "2", "slept"]


async def test_malformed_and_unknown_calls_are_reported_to_the_model_and_the_run_recovers() -> None:
    llm = ScriptedLLM(
        [
            reply(tool_calls=[call("add", raw='{"a": 1, "b": '), call("ad", a=1, b=2)]),
            reply(tool_calls=[call("add", a="x", b=2)]),
            reply(tool_calls=[call("add", a=1, b=2)]),
            "3",
        ]
    )
    agent = make_agent(llm)
    outcome, events = await run_collecting(agent, "add")
    assert outcome.stop_reason is StopReason.ANSWERED and outcome.final_text == "3"
    first, unknown, invalid, good = outcome.tool_uses
    assert first.is_error and "JSON" in first.content
    assert unknown.is_error and "unknown tool 'ad'" in unknown.content and "add" in unknown.content
    assert invalid.is_error
    assert not good.is_error and good.content == "3"
    assert sum(e.kind == "tool_call_failed" for e in events) == 3
    assert_history_consistent(agent)


async def test_a_text_answer_can_be_reprompted_a_bounded_number_of_times() -> None:
    llm = ScriptedLLM(["thinking aloud", "still talking", "and more"])
    agent = make_agent(llm, on_text_answer="reprompt", max_reprompts=2)
    outcome = await agent.run("do it")
    llm.assert_all_consumed()
    assert outcome.stop_reason is StopReason.ANSWERED
    assert "task_completion" in llm.requests[1].messages[-1].content


@pytest.mark.parametrize(
    ("tool_name", "arguments", "reason", "text"),
    [
        ("ask_question", {"question": "Which file?"}, StopReason.WAITING_FOR_USER, "Which file?"),
        ("converse", {"message": "Hello!"}, StopReason.CONVERSE, "Hello!"),
    ],
)
async def test_loop_control_tools_stop_the_run(
    tool_name: str, arguments: dict[str, str], reason: StopReason, text: str
) -> None:
    llm = ScriptedLLM([reply(tool_calls=[call(tool_name, **arguments)])])
    agent = make_agent(llm)
    outcome = await agent.run("task")
    assert (outcome.stop_reason, outcome.final_text) == (reason, text)


async def test_answering_a_question_continues_the_same_conversation() -> None:
    llm = ScriptedLLM(
        [reply(tool_calls=[call("ask_question", question="Which number?")]), "You said 7."]
    )
    agent = make_agent(llm)
    first = await agent.run("pick")
    assert first.stop_reason is StopReason.WAITING_FOR_USER
    second = await agent.send("7")
    assert second.final_text == "You said 7."
    assert second.run_id != first.run_id
    assert [m.content for m in llm.requests[1].messages if m.role == "user"] == ["pick", "7"]


async def test_max_iterations_stops_the_run() -> None:
    llm = FunctionLLM(lambda request: reply(tool_calls=[call("add", a=len(request.messages), b=0)]))
    agent = make_agent(llm, max_iterations=3)
    outcome = await agent.run("loop forever")
    assert outcome.stop_reason is StopReason.MAX_ITERATIONS
    assert outcome.iterations == 3
    assert_history_consistent(agent)


async def test_token_and_cost_limits_stop_the_run() -> None:
    usage = Usage(prompt_tokens=600, completion_tokens=100, total_tokens=700)
    looping = FunctionLLM(lambda request: reply(tool_calls=[call("add", a=1, b=1)], usage=usage))
    outcome = await make_agent(looping, max_total_tokens=1500).run("x")
    assert (outcome.stop_reason, outcome.iterations) == (StopReason.TOKEN_LIMIT, 3)
    assert outcome.usage.total_tokens == 2100
    assert len(outcome.usage_per_call) == 3

    pricing = Pricing(input_per_million=100.0, output_per_million=100.0)
    outcome = await make_agent(looping, max_cost_usd=0.5, pricing=pricing).run("x")
    # $0.07 a call, but each could cost its prompt plus a 2,000-token reserve: the run
    # stops before the call that might pass $0.50, not after it.
    assert outcome.stop_reason is StopReason.COST_LIMIT
    calls = len(outcome.usage_per_call)
    assert calls >= 2
    assert outcome.iterations == calls + 1  # the last iteration made no call
    assert outcome.cost_usd == pytest.approx(0.07 * calls)
    assert outcome.cost_usd is not None
    assert outcome.cost_usd <= 0.5
    assert outcome.final_text.startswith("stopped before a model call")


async def test_an_unmeetable_context_budget_stops_the_run() -> None:
    llm = ScriptedLLM([])
    agent = AgentExecutor(
        llm,
        config=AgentConfig(
            context=ContextConfig(max_tokens=1000, reserve_output_tokens=10, counter="approx")
        ),
    )
    outcome = await agent.run("word " * 2000)
    assert outcome.stop_reason is StopReason.CONTEXT_BUDGET
    assert "pinned history" in outcome.final_text
    assert outcome.errors[0].type == "ContextBudgetError"


async def test_a_stuck_model_is_warned_then_stopped() -> None:
    llm = FunctionLLM(lambda request: reply(tool_calls=[call("add", a=1, b=1)]))
    agent = make_agent(llm, stuck_threshold=2)
    outcome, events = await run_collecting(agent, "x")
    assert outcome.stop_reason is StopReason.STUCK
    assert outcome.iterations == 4
    warnings = [e for e in events if e.kind == "warning_raised" and e.source == "loop"]
    assert len(warnings) >= 2
    assert any("same" in m.content for m in llm.requests[-1].messages if m.role == "user")


async def test_fatal_model_errors_end_the_run_with_an_error_and_retryable_ones_are_retried() -> (
    None
):
    bad_key = ModelAuthenticationError("bad key", status_code=401)
    outcome = await make_agent(ScriptedLLM([fail(bad_key)])).run("x")
    assert outcome.stop_reason is StopReason.ERROR
    assert outcome.errors[0].type == "ModelAuthenticationError" and outcome.errors[0].fatal

    dropped = ModelConnectionError("connection dropped mid-stream")
    llm = ScriptedLLM([fail(dropped, partial_text="partial"), "recovered"])
    outcome = await make_agent(llm, model_retries=1).run("x")
    assert (outcome.stop_reason, outcome.final_text) == (StopReason.ANSWERED, "recovered")
    assert [e.fatal for e in outcome.errors] == [False]


class Answer(BaseModel):
    city: str
    population: int


async def test_structured_output_is_corrected_then_parsed() -> None:
    llm = ScriptedLLM(
        [
            "Paris has many people.",
            '{"city": "Paris", "population": "lots"}',
            '```json\n{"city": "Paris", "population": 2100000}\n```',
        ]
    )
    agent = AgentExecutor(llm, output_type=Answer, config=AgentConfig(max_output_retries=2))
    outcome = await agent.run("Population of Paris as JSON")
    assert outcome.stop_reason is StopReason.COMPLETED
    assert outcome.output_as(Answer) == Answer(city="Paris", population=2100000)
    corrections = [m.content for m in llm.requests[2].messages if m.role == "user"]
    assert "not valid JSON" in corrections[1]
    assert "population" in corrections[2]


async def test_structured_output_that_never_fits_ends_with_a_clear_error() -> None:
    schema = {
        "type": "object",
        "required": ["answer"],
        "properties": {"answer": {"type": "string"}},
    }
    llm = ScriptedLLM(['{"wrong": 1}', '{"still": "wrong"}'])
    agent = AgentExecutor(llm, config=AgentConfig(output_schema=schema, max_output_retries=1))
    outcome = await agent.run("answer")
    assert outcome.stop_reason is StopReason.OUTPUT_INVALID
    assert outcome.final_text == '{"still": "wrong"}'
    assert "'answer' is a required property" in outcome.errors[-1].message
    with pytest.raises(OutputValidationError):
        outcome.output_as(Answer)


async def test_cancel_mid_tool_cancels_the_tool_and_keeps_history_consistent() -> None:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "impossible"

    llm = ScriptedLLM([reply(tool_calls=[call("wait_forever"), call("add", a=1, b=2)])])
    agent = make_agent(llm)
    agent.tools.register(wait_forever)
    running = asyncio.create_task(agent.run("hang"))
    await started.wait()
    agent.cancel()
    outcome = await running
    assert outcome.stop_reason is StopReason.CANCELLED
    assert_history_consistent(agent)
    assert agent.history.pending_calls() == []


async def test_cancelling_the_task_re_raises_and_keeps_history_consistent() -> None:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "impossible"

    agent = make_agent(ScriptedLLM([reply(tool_calls=[call("wait_forever")]), "after"]))
    agent.tools.register(wait_forever)
    running = asyncio.create_task(agent.run("hang"))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert_history_consistent(agent)
    # The agent is usable again afterwards.
    assert (await agent.send("continue")).final_text == "after"


async def test_skills_swap_the_system_prompt_and_restrict_tools() -> None:
    skill = Skill(name="math", system_prompt="You only do math.", allowed_tools=("add",))
    llm = ScriptedLLM([reply(tool_calls=[call("note_fact", fact="x")]), "ok"])
    agent = make_agent(llm, skills=(skill,))
    agent.activate_skill("math")
    outcome = await agent.run("x")
    request: LLMRequest = llm.requests[0]
    assert request.messages[0].content.startswith("You only do math.")
    offered = {t.name for t in request.tools}
    assert "add" in offered and "note_fact" not in offered and "task_completion" in offered
    assert outcome.tool_uses[0].is_error
    assert "not available while skill 'math' is active" in outcome.tool_uses[0].content
    assert agent.environment.knowledge.discovered_facts == []


async def test_three_subscribers_see_the_same_ordered_events_while_one_is_slow() -> None:
    llm = ScriptedLLM(
        [reply("Step one.", tool_calls=[call("add", a=1, b=2)]), reply("Finished.")],
        chunk_size=2,
    )
    agent = make_agent(llm)
    fast = agent.subscribe()
    slow_sub = agent.subscribe(maxsize=2, policy="wait")
    lossy = agent.subscribe(maxsize=2, policy="drop_oldest")

    async def read(subscription: Any, delay: bool) -> list[AgentEvent]:
        seen = []
        async for event in subscription:
            seen.append(event)
            if delay:
                await asyncio.sleep(0)
                await asyncio.sleep(0)
        return seen

    readers = [
        asyncio.create_task(read(fast, False)),
        asyncio.create_task(read(slow_sub, True)),
    ]
    outcome = await agent.run("go")
    fast_events, slow_events = await asyncio.gather(*readers)
    assert outcome.final_text == "Finished."
    assert [e.seq for e in fast_events] == [e.seq for e in slow_events]
    assert [e.seq for e in fast_events] == list(range(len(fast_events)))
    dropped = [e async for e in lossy]
    assert dropped[0].kind == "events_dropped"
    assert dropped[-1].kind == "run_finished"


async def test_a_full_run_against_a_real_openai_compatible_server_streamed_and_not() -> None:
    async with OpenAIServer() as server:
        server.script(
            sse_reply(
                tool_call_chunks([("call_a", "add", json.dumps({"a": 20, "b": 22}))], chunk_size=3)
            ),
            sse_reply(text_chunks("The answer is 42.")),
            json_reply(
                completion_body(
                    None, tool_calls=[("c2", "add", '{"a": 1, "b": 1}')], finish_reason="tool_calls"
                )
            ),
            error_reply(500),
            json_reply(completion_body("Two.")),
        )
        client = OpenAIClient("test-model", base_url=server.base_url, api_key="k", max_retries=1)
        agent = make_agent(client)
        outcome, events = await run_collecting(agent, "What is 20 + 22?")
        assert outcome.final_text == "The answer is 42."
        assert outcome.tool_uses[0].content == "42"
        assert outcome.usage.prompt_tokens == 20 + 11
        assert any(e.kind == "text_delta" for e in events)
        assert any(e.kind == "tool_call_arguments_delta" for e in events)
        sent = server.bodies[1]["messages"]
        assert sent[-1] == {
            "role": "tool",
            "tool_call_id": "call_a",
            "content": "42",
            "name": "add",
        } or (sent[-1]["role"] == "tool" and sent[-1]["content"] == "42")

        plain = AgentExecutor(client, stream=False, config=agent.config)
        plain.tools.register(add)
        second = await plain.run("What is 1 + 1?")
        assert second.final_text == "Two."
        assert server.remaining == 0
        await client.aclose()


async def test_a_model_with_no_known_tokenizer_is_reported_once_per_run() -> None:
    from agent_flow.llm import LLMConfig

    config = AgentConfig(llm=LLMConfig(model="llama3"))
    agent = AgentExecutor(ScriptedLLM(["hi"]), config=config)
    outcome, events = await run_collecting(agent, "x")
    assert outcome.final_text == "hi"
    notes = [e for e in events if e.kind == "warning_raised" and e.source == "tokens"]
    assert len(notes) == 1
    assert "'llama3' has no known tokenizer encoding" in notes[0].message


async def test_a_configured_workspace_gives_the_agent_the_file_tools(tmp_path: Any) -> None:
    (tmp_path / "notes.txt").write_text("the key is 42\n")
    llm = ScriptedLLM([reply(tool_calls=[call("read_file", path="notes.txt")]), "42"])
    agent = AgentExecutor(llm, config=AgentConfig(workspace=str(tmp_path)))
    outcome = await agent.run("read the notes")
    assert "the key is 42" in outcome.tool_uses[0].content
    assert not outcome.tool_uses[0].is_error
