"""Structured output from the first request (issue 29, point 10), through the real openai SDK.

With an output schema the model is told the schema before it answers: ``task_completion``'s
``result`` parameter carries it, and a request without tools carries it as
``response_format`` (a server that refuses that field is asked again without it, once). A
``task_completion`` whose result does not match is refused in its own result, so the model
reads one consistent message, never "Task marked as complete." and then a correction.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_flow import OpenAIClient
from agent_flow._types import JsonValue
from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import ToolCallCompleted, WarningRaised
from agent_flow.messages import ToolDefinition
from agent_flow.testing.strategies import json_values
from agent_flow.tools import task_completion, with_result_schema
from tests.openai_server import (
    OpenAIServer,
    error_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)


class Place(BaseModel):
    city: str
    country: Literal["FR", "JP", "US"]


class Answer(BaseModel):
    """The population of a place."""

    place: Place
    population: int
    sources: list[str] = []


GOOD: dict[str, JsonValue] = {"place": {"city": "Paris", "country": "FR"}, "population": 2}
BAD: dict[str, JsonValue] = {"place": {"city": "Paris", "country": "France"}, "population": 2}


@contextlib.asynccontextmanager
async def client(server: OpenAIServer) -> AsyncIterator[OpenAIClient]:
    llm = OpenAIClient("m", base_url=server.base_url, api_key="k")
    try:
        yield llm
    finally:
        await llm.aclose()


def config(**fields: Any) -> AgentConfig:
    return AgentConfig(context=ContextConfig(max_tokens=8000, counter="approx"), **fields)


def finish(result: JsonValue, call_id: str = "call_1") -> bytes | Any:
    arguments = json.dumps({"summary": "done", "result": result})
    return sse_reply(tool_call_chunks([(call_id, "task_completion", arguments)]))


def offered(body: dict[str, Any], name: str) -> dict[str, Any]:
    for entry in body.get("tools", []):
        if entry["function"]["name"] == name:
            return entry["function"]["parameters"]  # type: ignore[no-any-return]
    raise AssertionError(f"{name} was not offered: {body.get('tools')}")


# -- the schema travels in task_completion's result ---------------------------------------------


_MODELS: list[type[BaseModel]] = [Answer, Place]
COMPLETION = ToolDefinition(
    name=task_completion.name,
    description=task_completion.description,
    parameters=task_completion.parameters,
)


@settings(max_examples=60)
@given(
    model=st.sampled_from(_MODELS),
    value=st.one_of(json_values(), st.just(GOOD), st.just(BAD), st.just(GOOD["place"])),
    summary=st.text(max_size=5),
)
def test_task_completion_offered_with_a_schema_accepts_exactly_what_the_schema_accepts(
    model: type[BaseModel], value: JsonValue, summary: str
) -> None:
    schema = model.model_json_schema()
    parameters = with_result_schema(COMPLETION, schema).parameters
    jsonschema.Draft202012Validator.check_schema(parameters)
    as_called = jsonschema.Draft202012Validator(parameters).is_valid(
        {"summary": summary, "result": value}
    )
    assert as_called == jsonschema.Draft202012Validator(schema).is_valid(value)
    assert "result" in parameters["required"]


async def test_the_first_request_tells_the_model_the_output_schema() -> None:
    async with OpenAIServer() as server:
        server.script(finish(GOOD))
        async with client(server) as llm:
            agent = AgentExecutor(llm, config=config(), output_type=Answer)
            outcome = await agent.run("How many people live in Paris?")
    assert outcome.stop_reason is StopReason.COMPLETED
    assert outcome.output_as(Answer) == Answer.model_validate(GOOD)
    (first,) = server.bodies
    parameters = offered(first, "task_completion")
    validator = jsonschema.Draft202012Validator(parameters)
    assert validator.is_valid({"summary": "s", "result": GOOD})
    assert not validator.is_valid({"summary": "s", "result": BAD})
    assert "result" in parameters["required"]
    # With tools offered, no response_format: a grammar would keep a local server from
    # calling them.
    assert "response_format" not in first


# -- one consistent message after an invalid task_completion ------------------------------------


async def test_an_invalid_task_completion_is_refused_in_its_own_result() -> None:
    async with OpenAIServer() as server:
        server.script(finish(BAD, "call_1"), finish(GOOD, "call_2"))
        async with client(server) as llm:
            agent = AgentExecutor(llm, config=config(), output_type=Answer)
            completed = agent.subscribe(kinds=["tool_call_completed"])
            outcome = await agent.run("How many people live in Paris?")
    assert outcome.stop_reason is StopReason.COMPLETED
    assert outcome.output_as(Answer) == Answer.model_validate(GOOD)
    second = server.bodies[1]["messages"]
    # What the model reads after its first call: the refusal, and nothing after it.
    assert second[-1]["role"] == "tool"
    assert second[-1]["tool_call_id"] == "call_1"
    refusal = second[-1]["content"]
    assert refusal.startswith("Not complete")
    assert "/place/country" in refusal
    assert json.dumps(Answer.model_json_schema()) in refusal
    assert all("Task marked as complete" not in str(m.get("content")) for m in second)
    events = [e async for e in completed]
    assert isinstance(events[0], ToolCallCompleted)
    assert (events[0].is_error, events[0].content) == (True, refusal)
    assert [use.is_error for use in outcome.tool_uses] == [True, False]


async def test_refused_completions_count_against_the_correction_limit() -> None:
    async with OpenAIServer() as server:
        server.script(finish(BAD, "call_1"), finish(BAD, "call_2"))
        async with client(server) as llm:
            agent = AgentExecutor(llm, config=config(max_output_retries=1), output_type=Answer)
            outcome = await agent.run("How many people live in Paris?")
    assert outcome.stop_reason is StopReason.OUTPUT_INVALID
    assert len(server.bodies) == 2
    assert "/place/country" in outcome.errors[-1].message


# -- response_format where nothing else can carry the schema ------------------------------------


async def test_a_request_without_tools_asks_for_the_schema_as_response_format() -> None:
    async with OpenAIServer() as server:
        server.script(sse_reply(text_chunks(json.dumps(GOOD))))
        async with client(server) as llm:
            agent = AgentExecutor(llm, config=config(control_tools=False), output_type=Answer)
            outcome = await agent.run("How many people live in Paris? Answer in JSON.")
    assert outcome.output_as(Answer) == Answer.model_validate(GOOD)
    (body,) = server.bodies
    assert "tools" not in body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Answer", "schema": Answer.model_json_schema()},
    }


async def test_a_server_that_refuses_response_format_is_asked_again_without_it_once() -> None:
    async with OpenAIServer() as server:
        server.script(
            error_reply(400, "unknown field: response_format"),
            sse_reply(text_chunks(json.dumps(GOOD))),
            sse_reply(text_chunks(json.dumps(GOOD))),
        )
        async with client(server) as llm:
            agent = AgentExecutor(llm, config=config(control_tools=False), output_type=Answer)
            warnings = agent.subscribe(kinds=["warning_raised"])
            first = await agent.run("How many people live in Paris?")
            notes = [e.message async for e in warnings if isinstance(e, WarningRaised)]
            second = await agent.send("And again?")
    assert first.stop_reason is second.stop_reason is StopReason.COMPLETED
    assert ["response_format" in body for body in server.bodies] == [True, False, False]
    assert len([n for n in notes if "refused response_format" in n]) == 1


async def test_a_schema_from_the_config_is_offered_and_sent_the_same_way() -> None:
    schema = {
        "type": "object",
        "required": ["answer"],
        "properties": {"answer": {"type": "integer"}},
    }
    async with OpenAIServer() as server:
        server.script(sse_reply(text_chunks('{"answer": 42}')))
        async with client(server) as llm:
            agent = AgentExecutor(llm, config=config(control_tools=False, output_schema=schema))
            outcome = await agent.run("The answer?")
    assert outcome.output == {"answer": 42}
    assert server.bodies[0]["response_format"]["json_schema"] == {
        "name": "output",
        "schema": schema,
    }
