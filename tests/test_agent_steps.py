"""The loop's steps (agent/_steps.py, agent/_output.py): each test failed on the steps as
they were before and names what was wrong.

Covered: a ``task_completion`` result held to the output schema like a text answer, and the
model stream closed however the loop leaves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import TaskStatus
from agent_flow.errors import ModelResponseError
from agent_flow.llm.base import Completion, LLMRequest, StreamEvent, TextChunk
from agent_flow.testing import Reply, ScriptedLLM, call, reply


def make_agent(llm: Any, **kwargs: Any) -> AgentExecutor:
    config = kwargs.pop("config", None) or AgentConfig(
        context=ContextConfig(max_tokens=8000, counter="approx")
    )
    return AgentExecutor(llm, config=config, **kwargs)


def completion(summary: str, result: Any = None) -> Reply:
    arguments: dict[str, Any] = {"summary": summary}
    if result is not None:
        arguments["result"] = result
    return reply(tool_calls=[call("task_completion", arguments)])


class Answer(BaseModel):
    answer: int


# -- 3. output_type holds however the run ends ---------------------------------------------------


async def test_a_task_completion_result_is_validated_and_corrected_like_a_text_answer() -> None:
    """agent/_steps.py `_control` returned the result of ``task_completion`` unchecked: with
    ``output_type=Answer`` a run could complete with ``{"answer": "many"}``.
    """
    llm = ScriptedLLM([completion("done", {"answer": "many"}), completion("done", {"answer": 42})])
    agent = make_agent(llm, output_type=Answer)
    outcome = await agent.run("count")
    assert outcome.stop_reason is StopReason.COMPLETED
    assert outcome.output_as(Answer) == Answer(answer=42)
    assert outcome.final_text == "done"
    correction = llm.requests[1].messages[-1].content
    assert "task_completion" in correction
    assert "at /answer" in correction
    assert agent.environment.task.status is TaskStatus.COMPLETED


async def test_a_task_completion_result_given_as_json_text_is_read_as_json() -> None:
    agent = make_agent(ScriptedLLM([completion("done", '{"answer": 7}')]), output_type=Answer)
    outcome = await agent.run("count")
    assert outcome.output == {"answer": 7}


async def test_a_task_completion_that_never_fits_ends_as_output_invalid() -> None:
    config = AgentConfig(
        context=ContextConfig(max_tokens=8000, counter="approx"),
        output_schema={"type": "object", "required": ["answer"]},
        max_output_retries=1,
    )
    llm = ScriptedLLM([completion("first"), completion("second", {"other": 1})])
    agent = make_agent(llm, config=config)
    outcome = await agent.run("count")
    assert outcome.stop_reason is StopReason.OUTPUT_INVALID
    assert outcome.final_text == "second"
    assert "'answer' is a required property" in outcome.errors[-1].message
    assert agent.environment.task.status is not TaskStatus.COMPLETED


# -- 10. the model stream is closed ---------------------------------------------------------------


class RecordingStream:
    """A model stream (not an async generator) that records whether it was closed."""

    def __init__(self, chunks: list[StreamEvent], *, then: BaseException | None = None) -> None:
        self.chunks = chunks
        self.then = then
        self.closed = False
        self.waiting = asyncio.Event()

    def __aiter__(self) -> RecordingStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self.chunks:
            return self.chunks.pop(0)
        if self.then is not None:
            raise self.then
        self.waiting.set()
        await asyncio.Event().wait()  # a server that stops sending
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


class StreamingModel:
    """An `LLMClient` whose stream is the given `RecordingStream`."""

    model = "recording"

    def __init__(self, stream: RecordingStream) -> None:
        self.the_stream = stream

    async def complete(self, request: LLMRequest) -> Completion:
        raise AssertionError("the agent streams")

    def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        return self.the_stream


async def test_the_model_stream_is_closed_when_the_run_is_cancelled_mid_stream() -> None:
    """agent/_model_call.py `_call_model` left the stream unclosed when it stopped reading it: the
    connection stayed open until garbage collection.
    """
    stream = RecordingStream([TextChunk(text="part")])
    agent = make_agent(StreamingModel(stream), stream=True)
    running = asyncio.create_task(agent.run("go"))
    await stream.waiting.wait()
    agent.cancel()
    assert (await running).stop_reason is StopReason.CANCELLED
    assert stream.closed


async def test_the_model_stream_is_closed_when_it_fails_and_when_it_ends() -> None:
    failing = RecordingStream(
        [TextChunk(text="part")], then=ModelResponseError("the stream broke off")
    )
    outcome = await make_agent(StreamingModel(failing), stream=True).run("go")
    assert outcome.stop_reason is StopReason.ERROR
    assert failing.closed
    ending = RecordingStream([TextChunk(text="all"), Completion(text="all")])
    ending.then = StopAsyncIteration()
    outcome = await make_agent(StreamingModel(ending), stream=True).run("go")
    assert outcome.final_text == "all"
    assert ending.closed
