"""OpenAIClient and the agent against what real servers do (issue 15), over real HTTP.

The scripted server is made to behave as observed servers behave: llama-cpp-python (HTTP 500
on ``"content": null``, streams refused inside an HTTP 200, tools dropped without
``tool_choice``), proxies that stall, rate limits with ``Retry-After``, servers that accept
and then close, and streams without usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from agent_flow.agent import ExecutionOutcome, StopReason
from agent_flow.errors import ModelConnectionError, ModelServerError, ModelTimeoutError
from agent_flow.events import (
    AgentEvent,
    ContextBuilt,
    ModelOutputDiscarded,
    ModelResponded,
    ModelRetrying,
    TextDelta,
    WarningRaised,
)
from agent_flow.llm import (
    Completion,
    LLMRequest,
    OpenAIClient,
    RetryNotice,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ToolCallChunk,
)
from agent_flow.llm._openai_retry import Timeouts
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from agent_flow.tools import Tool
from tests.helpers import drain_into, make_agent
from tests.openai_server import (
    OpenAIServer,
    RecordedRequest,
    Reply,
    completion_body,
    error_reply,
    json_reply,
    llama_cpp_like,
    sse_reply,
    stream_error_reply,
    text_chunks,
    tool_call_chunks,
)

READ_FILE = ToolDefinition(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
WITH_TOOLS = LLMRequest(messages=[ChatMessage(role="user", content="read a.py")], tools=[READ_FILE])
AFTER_A_TOOL_TURN = LLMRequest(
    messages=[
        ChatMessage(role="user", content="read a.py"),
        ChatMessage(
            role="assistant",
            content="",
            tool_calls=(ToolCall.from_raw("call_1", "read_file", '{"path": "a.py"}'),),
        ),
        ChatMessage(role="tool", tool_call_id="call_1", content="print(1)"),
    ],
    tools=[READ_FILE],
)


@pytest.fixture
async def client(openai_server: OpenAIServer) -> AsyncIterator[OpenAIClient]:
    llm = OpenAIClient("test-model", base_url=openai_server.base_url, api_key="k", timeout=5)
    yield llm
    await llm.aclose()


async def collect(events: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in events]


def final_completion(events: list[StreamEvent]) -> Completion:
    assert isinstance(events[-1], Completion)
    return events[-1]


# -- 1. the wire format ------------------------------------------------------------------------


async def test_tool_choice_auto_is_sent_whenever_tools_are_offered(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.script(json_reply(completion_body("ok")), json_reply(completion_body("ok")))
    await client.complete(WITH_TOOLS)
    await client.complete(LLMRequest(messages=WITH_TOOLS.messages))
    with_tools, without = openai_server.bodies
    assert with_tools["tool_choice"] == "auto"
    assert "tool_choice" not in without


async def test_the_default_tool_choice_is_configurable_and_a_request_s_own_wins(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(json_reply(completion_body("ok")), json_reply(completion_body("ok")))
    async with OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", tool_choice=None
    ) as llm:
        await llm.complete(WITH_TOOLS)
        await llm.complete(WITH_TOOLS.model_copy(update={"tool_choice": "required"}))
    first, second = openai_server.bodies
    assert "tool_choice" not in first
    assert second["tool_choice"] == "required"


async def test_an_assistant_tool_turn_is_accepted_by_a_server_that_refuses_null_content(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.script(llama_cpp_like(json_reply(completion_body("done"))))
    completion = await client.complete(AFTER_A_TOOL_TURN)
    assert completion.text == "done"
    assistant = openai_server.bodies[0]["messages"][1]
    assert assistant["content"] == ""
    assert len(openai_server.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_legacy_function_call_beside_tool_calls_is_one_call(
    client: OpenAIClient, openai_server: OpenAIServer, stream: bool
) -> None:
    if stream:
        chunks = tool_call_chunks([("call_9", "read_file", '{"path": "a.py"}')])
        chunks.insert(
            2,
            {
                "id": "x",
                "model": "test-model",
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "function_call": {"name": "read_file", "arguments": '{"path": "a.py"}'}
                        },
                        "finish_reason": None,
                    }
                ],
            },
        )
        openai_server.script(sse_reply(chunks))
        events = await collect(client.stream(WITH_TOOLS))
        completion = final_completion(events)
        assert [e.id for e in events if isinstance(e, ToolCallChunk)] == ["call_9"]
    else:
        openai_server.script(
            json_reply(
                completion_body(
                    None,
                    tool_calls=[("call_9", "read_file", '{"path": "a.py"}')],
                    function_call=("read_file", '{"path": "a.py"}'),
                )
            )
        )
        completion = await client.complete(WITH_TOOLS)
    assert [(c.id, c.name) for c in completion.tool_calls] == [("call_9", "read_file")]


async def test_a_legacy_function_call_alone_is_still_a_tool_call_when_streamed(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    chunk = {
        "id": "x",
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "delta": {"function_call": {"name": "read_file", "arguments": '{"path": "b"}'}},
                "finish_reason": "function_call",
            }
        ],
    }
    openai_server.script(sse_reply([chunk]))
    events = await collect(client.stream(WITH_TOOLS))
    assert [e.name for e in events if isinstance(e, ToolCallChunk)] == ["read_file"]
    assert final_completion(events).tool_calls[0].arguments == '{"path": "b"}'


async def test_a_stream_refused_inside_http_200_falls_back_to_a_plain_request(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.script(
        stream_error_reply("streaming with tools is not supported"),
        json_reply(completion_body("fell back")),
        json_reply(completion_body("again")),
    )
    events = await collect(client.stream(WITH_TOOLS))
    warnings = [e for e in events if isinstance(e, StreamWarning)]
    assert [w.code for w in warnings] == ["stream_with_tools_unsupported"]
    completion = final_completion(events)
    assert completion.text == "fell back"
    assert openai_server.bodies[1].get("stream") is None
    # Remembered: the next answer with tools is not streamed at all.
    assert final_completion(await collect(client.stream(WITH_TOOLS))).text == "again"
    assert openai_server.bodies[2].get("stream") is None


async def test_a_stream_ended_empty_with_tools_falls_back_to_a_plain_request(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    # llama-cpp-python 0.3.36: HTTP 200, then the stream ends without a single event.
    openai_server.script(sse_reply([], done=False), json_reply(completion_body("fell back")))
    events = await collect(client.stream(WITH_TOOLS))
    assert [e.code for e in events if isinstance(e, StreamWarning)] == [
        "stream_with_tools_unsupported"
    ]
    assert final_completion(events).text == "fell back"
    assert len(openai_server.requests) == 2


async def test_a_stream_error_event_without_tools_is_still_an_error(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    from agent_flow.errors import ModelResponseError

    openai_server.script(stream_error_reply("the model crashed"))
    with pytest.raises(ModelResponseError, match="the model crashed"):
        await collect(client.stream(LLMRequest(messages=WITH_TOOLS.messages)))


@pytest.mark.parametrize("reason", ["content_filter", "length"])
async def test_answers_cut_by_the_provider_are_not_reported_as_clean(
    client: OpenAIClient, openai_server: OpenAIServer, reason: str
) -> None:
    openai_server.script(sse_reply(text_chunks("partial", finish_reason=reason)))
    completion: Completion = final_completion(await collect(client.stream(WITH_TOOLS)))
    assert completion.finish_reason == reason


# -- through an agent ----------------------------------------------------------------------------


async def run_agent(
    llm: OpenAIClient, *tools: Tool, stream: bool = True, **config: object
) -> tuple[ExecutionOutcome, list[AgentEvent]]:
    agent = make_agent(llm, *tools, **config)
    agent.stream = stream
    events: list[AgentEvent] = []
    subscription = agent.subscribe()

    async def read() -> None:
        events.extend([event async for event in subscription])

    reader = asyncio.create_task(read())
    outcome = await agent.run("do it")
    await reader
    return outcome, events


def warnings_of(events: list[AgentEvent]) -> list[str]:
    return [e.message for e in events if isinstance(e, WarningRaised)]


async def test_a_content_filtered_answer_warns_in_the_run(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.script(sse_reply(text_chunks("I can't", finish_reason="content_filter")))
    _, events = await run_agent(client, max_iterations=1)
    assert any("content_filter" in message for message in warnings_of(events))


async def test_a_stream_warning_is_published_once(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.script(
        error_reply(400, "streaming is not supported with tools", retry_after_ms=None),
        json_reply(completion_body("done")),
    )
    _, events = await run_agent(client, max_iterations=1)
    fallbacks = [m for m in warnings_of(events) if "without streaming" in m]
    assert len(fallbacks) == 1


async def test_a_server_that_dropped_the_tools_is_warned_about_once(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    # llama-cpp-python asked without tool_choice: it counts the prompt without the tools.
    client.tool_choice = None
    openai_server.script(
        sse_reply(tool_call_chunks([("c1", "add", '{"a": 1, "b": 2}')], usage=(60, 9))),
        sse_reply(text_chunks("3", usage=(70, 2))),
    )
    _, events = await run_agent(client, max_iterations=2)
    breakdown = next(e for e in events if isinstance(e, ContextBuilt)).breakdown
    assert breakdown.tools > breakdown.total / 2  # the schemas are most of the prompt
    dropped = [m for m in warnings_of(events) if "dropped the tools" in m]
    assert len(dropped) == 1
    assert "60 prompt tokens" in dropped[0] and "tool_choice" in dropped[0]


@pytest.mark.parametrize("tool_mode", ["native", "xml"])
async def test_a_server_that_counted_the_tools_is_not_warned_about(
    openai_server: OpenAIServer, tool_mode: str
) -> None:
    # Counted by another tokenizer (here 20% fewer tokens): still clearly with the tools.
    def counted(request: RecordedRequest) -> Reply:
        size = len(json.dumps(request.body)) // 5
        return sse_reply(text_chunks("done", usage=(size, 2)))

    openai_server.handler = counted
    async with OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", tool_mode=tool_mode
    ) as llm:
        _, events = await run_agent(llm, max_iterations=1)
    assert [m for m in warnings_of(events) if "dropped the tools" in m] == []


# -- 2. timeouts and retries -------------------------------------------------------------------


def test_the_default_timeouts_and_the_one_retry_layer() -> None:
    llm = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert llm.timeouts == Timeouts(connect=10.0, first_byte=120.0, chunk=60.0, request=600.0)
    assert llm.max_retries == 2
    assert llm.sdk_client.max_retries == 0  # so attempts are never multiplied


async def test_a_server_that_never_starts_answering_hits_the_first_byte_timeout(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(Reply(hang=True))
    async with OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", first_byte_timeout=0.2, max_retries=0
    ) as llm:
        with pytest.raises(ModelTimeoutError, match=r"first-byte timeout of 0.2 s"):
            await collect(llm.stream(WITH_TOOLS))


async def test_a_stream_that_stalls_mid_answer_hits_the_chunk_timeout(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(sse_reply(text_chunks("abcdef", chunk_size=2), stall_after=3))
    seen: list[StreamEvent] = []
    async with OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", chunk_timeout=0.2, max_retries=0
    ) as llm:
        with pytest.raises(ModelTimeoutError, match=r"chunk timeout of 0.2 s") as caught:
            await drain_into(llm.stream(WITH_TOOLS), seen)
    assert "".join(e.text for e in seen if isinstance(e, TextChunk)) == "abcd"
    assert caught.value.attempts == 1


async def test_a_non_streamed_answer_that_never_comes_hits_the_request_timeout(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(Reply(hang=True))
    async with OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", timeout=0.2, max_retries=0
    ) as llm:
        with pytest.raises(ModelTimeoutError, match=r"request timeout of 0.2 s"):
            await llm.complete(WITH_TOOLS)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_attempt_that_used_the_whole_request_timeout_is_not_tried_again(
    openai_server: OpenAIServer, stream: bool
) -> None:
    # A model generating without end (llama-cpp-python ignores max_tokens when it picks
    # tools itself) would run as long again on every retry: one timeout ends the call.
    if stream:  # it streams, then goes silent for less than the chunk timeout
        openai_server.script(
            sse_reply(text_chunks("abcdef", chunk_size=2), stall_after=1),
            sse_reply(text_chunks("never asked for")),
        )
    else:
        openai_server.script(Reply(hang=True), json_reply(completion_body("never asked for")))
    async with OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", timeout=0.3, chunk_timeout=30
    ) as llm:
        assert llm.max_retries == 2
        call = collect(llm.stream(WITH_TOOLS)) if stream else llm.complete(WITH_TOOLS)
        with pytest.raises(ModelTimeoutError, match=r"request timeout of 0.3 s") as caught:
            await call
    assert caught.value.attempts == 1
    assert not caught.value.retryable
    assert len(openai_server.requests) == 1


async def test_retry_after_is_honoured_and_announced(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.script(
        error_reply(429, "slow down", retry_after_ms=None, headers={"retry-after": "0.3"}),
        sse_reply(text_chunks("ok")),
    )
    events = await collect(client.stream(WITH_TOOLS))
    notices = [e for e in events if isinstance(e, RetryNotice)]
    assert [(n.attempt, n.max_attempts, n.discarded) for n in notices] == [(1, 3, False)]
    assert 0.3 <= notices[0].delay <= 0.33
    assert "HTTP 429" in notices[0].reason
    assert final_completion(events).text == "ok"
    assert len(openai_server.requests) == 2


async def test_a_500_repeated_on_the_identical_request_is_not_retried_as_transient(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.handler = lambda request: error_reply(500, "template failed", retry_after_ms=1)
    with pytest.raises(ModelServerError, match="not transient") as caught:
        await client.complete(WITH_TOOLS)
    assert caught.value.attempts == 2
    assert len(openai_server.requests) == 2


async def test_a_server_that_accepts_then_closes_is_not_reported_as_unreachable(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    client.max_retries = 0
    openai_server.script(Reply(close_at_once=True))
    with pytest.raises(ModelConnectionError, match="accepted the connection and closed it"):
        await client.complete(WITH_TOOLS)


async def test_a_cut_stream_is_retried_and_its_partial_text_discarded(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    client.retry_base_delay = 0.001
    openai_server.script(
        sse_reply(text_chunks("the first try", chunk_size=4), drop_after=3),
        sse_reply(text_chunks("second", chunk_size=4)),
    )
    events = await collect(client.stream(WITH_TOOLS))
    notices = [e for e in events if isinstance(e, RetryNotice)]
    assert [(n.attempt, n.discarded) for n in notices] == [(1, True)]
    assert final_completion(events).text == "second"


async def test_an_agent_voids_the_partial_text_of_a_retried_attempt(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    client.retry_base_delay = 0.001
    openai_server.script(
        sse_reply(text_chunks("the first try", chunk_size=4), drop_after=3),
        sse_reply(text_chunks("second", chunk_size=4)),
    )
    _, events = await run_agent(client, max_iterations=1)
    joined = ""
    for event in events:
        if isinstance(event, TextDelta):
            joined += event.text
        elif isinstance(event, ModelOutputDiscarded):
            assert joined.endswith(event.text)
            joined = joined[: len(joined) - len(event.text)]
    assert joined == "second"
    kinds = [e.kind for e in events if isinstance(e, ModelOutputDiscarded | ModelRetrying)]
    assert kinds == ["model_output_discarded", "model_retrying"]


@pytest.mark.parametrize("stream", [True, False])
async def test_an_agent_does_not_multiply_the_client_s_attempts(
    client: OpenAIClient, openai_server: OpenAIServer, stream: bool
) -> None:
    openai_server.handler = lambda request: error_reply(
        503, f"busy {len(openai_server.requests)}", retry_after_ms=1
    )
    outcome, events = await run_agent(client, stream=stream, max_iterations=1)
    assert outcome.stop_reason is StopReason.ERROR
    assert len(openai_server.requests) == 3
    retrying = [e for e in events if isinstance(e, ModelRetrying)]
    assert [(e.attempt, e.max_attempts) for e in retrying] == [(1, 3), (2, 3)]
    assert "gave up after 3 attempts" in outcome.errors[-1].message


# -- 3. usage that counts ------------------------------------------------------------------------


async def test_a_stream_without_usage_is_counted_by_agent_flow_and_limits_hold(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    looping = sse_reply(tool_call_chunks([("c1", "add", '{"a": 1, "b": 2}')], usage=None))
    openai_server.handler = lambda request: looping
    outcome, events = await run_agent(client, max_iterations=4, max_total_tokens=300)
    assert outcome.stop_reason is StopReason.TOKEN_LIMIT
    assert outcome.usage.estimated
    assert outcome.usage.prompt_tokens > 0 and outcome.usage.completion_tokens > 0
    first_prompt = next(e for e in events if isinstance(e, ContextBuilt)).breakdown.total
    responded = [e for e in events if isinstance(e, ModelResponded)]
    assert responded[0].prompt_tokens == first_prompt
    assert len([m for m in warnings_of(events) if "reported no token usage" in m]) == 1


async def test_reported_usage_is_not_estimated(
    client: OpenAIClient, openai_server: OpenAIServer
) -> None:
    openai_server.script(sse_reply(text_chunks("done", usage=(30, 4))))
    outcome, events = await run_agent(client, max_iterations=1)
    assert (outcome.usage.total_tokens, outcome.usage.estimated) == (34, False)
    assert not [m for m in warnings_of(events) if "usage" in m]
