"""OpenAIClient through the real AsyncOpenAI SDK, over real HTTP, against a scripted server."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator

import pytest

from agent_flow.errors import (
    ConfigError,
    IncompleteStreamError,
    MalformedChunkError,
    ModelAuthenticationError,
    ModelBadRequestError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
)
from agent_flow.llm import (
    Completion,
    LLMRequest,
    OpenAIClient,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    final_completion,
)
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from tests.helpers import drain_into
from tests.openai_server import (
    OpenAIServer,
    RecordedRequest,
    Reply,
    completion_body,
    error_reply,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

SECRET = "sk-test-0123456789abcdef-SECRET"
READ_FILE = ToolDefinition(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
HELLO = LLMRequest(messages=[ChatMessage(role="user", content="hi")])
WITH_TOOLS = LLMRequest(messages=[ChatMessage(role="user", content="read a.py")], tools=[READ_FILE])


@pytest.fixture
async def client(openai_server: OpenAIServer) -> AsyncIterator[OpenAIClient]:
    llm = OpenAIClient(
        "test-model", base_url=openai_server.base_url, api_key=SECRET, max_retries=2, timeout=5
    )
    yield llm
    await llm.aclose()


async def collect(events: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in events]


def texts(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextChunk))


# -- streaming -------------------------------------------------------------------------------


async def test_a_text_stream_in_many_small_chunks_arrives_as_text_chunks_and_one_completion(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    answer = "The quick brown fox jumps over the lazy dog, twice.  \n"
    openai_server.script(sse_reply(text_chunks(answer, chunk_size=2), split_bytes=5))

    events = await collect(client.stream(HELLO))

    chunks = [e for e in events if isinstance(e, TextChunk)]
    assert len(chunks) == (len(answer) + 1) // 2
    assert texts(events) == answer
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert [e for e in events if isinstance(e, Completion)] == [completion]
    assert completion.text == answer.strip()
    assert completion.finish_reason == "stop"
    assert completion.model == "test-model"
    assert completion.response_id == "chatcmpl-test"
    body = openai_server.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {SECRET}"


async def test_usage_in_the_last_chunk_is_reported_with_cached_and_reasoning_tokens(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunks = text_chunks("ok", usage=None)
    chunks.append(
        {
            "id": "chatcmpl-test",
            "model": "test-model",
            "choices": [],
            "usage": {
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "total_tokens": 150,
                "prompt_tokens_details": {"cached_tokens": 100},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        }
    )
    openai_server.script(sse_reply(chunks))

    completion = await final_completion(client.stream(HELLO))

    assert completion.usage is not None
    assert completion.usage.model_dump() == {
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "total_tokens": 150,
        "cached_tokens": 100,
        "reasoning_tokens": 12,
        "estimated": False,
    }


async def test_several_parallel_tool_calls_are_assembled_by_index_from_interleaved_fragments(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    calls = [
        ("call_a", "read_file", '{"path": "src/a.py"}'),
        ("call_b", "read_file", '{"path": "src/bb.py", "limit": 10}'),
        ("call_c", "list_dir", "{}"),
    ]
    openai_server.script(sse_reply(tool_call_chunks(calls, chunk_size=3, interleave=True)))

    events = await collect(client.stream(WITH_TOOLS))

    started = [e for e in events if isinstance(e, ToolCallChunk)]
    assert [(e.index, e.id, e.name) for e in started] == [
        (0, "call_a", "read_file"),
        (1, "call_b", "read_file"),
        (2, "call_c", "list_dir"),
    ]
    for index, (_, _, arguments) in enumerate(calls):
        pieces = [
            e.delta for e in events if isinstance(e, ToolCallArgumentsChunk) and e.index == index
        ]
        assert len(pieces) > 1 or arguments == "{}"
        assert "".join(pieces) == arguments
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.finish_reason == "tool_calls"
    assert [c.id for c in completion.tool_calls] == ["call_a", "call_b", "call_c"]
    assert completion.tool_calls[1].parsed_arguments == {"path": "src/bb.py", "limit": 10}
    assert all(c.is_valid for c in completion.tool_calls)
    assert openai_server.requests[0].body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": READ_FILE.parameters,
            },
        }
    ]


async def test_tool_call_arguments_that_are_not_valid_json_are_kept_raw_and_marked_invalid(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    calls = [
        ("c1", "read_file", '{"path": "a.py"'),
        ("c2", "read_file", "[1, 2]"),
        ("c3", "read_file", '{"path": "ok.py"}'),
    ]
    openai_server.script(sse_reply(tool_call_chunks(calls)))

    completion = await final_completion(client.stream(WITH_TOOLS))

    broken, array, fine = completion.tool_calls
    assert broken.arguments == '{"path": "a.py"'
    assert broken.parsed_arguments is None
    assert broken.parse_error is not None
    assert "not valid JSON" in broken.parse_error
    assert array.parse_error == "the arguments must be a JSON object, not a JSON array"
    assert fine.is_valid
    assert fine.parsed_arguments == {"path": "ok.py"}


async def test_tool_calls_without_ids_or_with_reused_ids_get_fresh_unique_ids(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    history = LLMRequest(
        messages=[
            ChatMessage(role="user", content="go"),
            ChatMessage(role="assistant", tool_calls=(ToolCall(id="call_0", name="read_file"),)),
            ChatMessage(role="tool", content="...", tool_call_id="call_0"),
        ],
        tools=[READ_FILE],
    )
    calls = [
        (None, "read_file", '{"path": "a"}'),
        ("call_0", "read_file", '{"path": "b"}'),  # llama.cpp-style id reused across turns
        ("dup", "read_file", '{"path": "c"}'),
        ("dup", "read_file", '{"path": "d"}'),  # reused within the answer
    ]
    openai_server.script(sse_reply(tool_call_chunks(calls)))

    events = await collect(client.stream(history))

    completion = events[-1]
    assert isinstance(completion, Completion)
    ids = [c.id for c in completion.tool_calls]
    assert len(set(ids)) == 4
    assert "call_0" not in ids
    assert ids[2] == "dup"
    assert all(ids)
    assert [e.id for e in events if isinstance(e, ToolCallChunk)] == ids
    assert [c.parsed_arguments for c in completion.tool_calls] == [{"path": p} for p in "abcd"]


async def test_tool_call_fragments_without_index_are_joined_by_id(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    calls = [("x1", "read_file", '{"path": "a.py"}'), ("x2", "read_file", '{"path": "b.py"}')]
    openai_server.script(sse_reply(tool_call_chunks(calls, chunk_size=5, with_index=False)))

    completion = await final_completion(client.stream(WITH_TOOLS))

    assert [(c.id, c.parsed_arguments) for c in completion.tool_calls] == [
        ("x1", {"path": "a.py"}),
        ("x2", {"path": "b.py"}),
    ]


async def test_finish_reason_stop_with_tool_calls_present_is_reported_as_tool_calls(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunks = tool_call_chunks([("c1", "read_file", "{}")], finish_reason="stop")
    openai_server.script(sse_reply(chunks))

    completion = await final_completion(client.stream(WITH_TOOLS))

    assert completion.finish_reason == "tool_calls"
    assert completion.raw_finish_reason == "stop"


async def test_a_model_that_hits_max_tokens_is_reported_as_length(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(sse_reply(text_chunks("This answer was cut", finish_reason="length")))
    request = LLMRequest(messages=HELLO.messages, max_tokens=5)

    completion = await final_completion(client.stream(request))

    assert completion.finish_reason == "length"
    assert completion.text == "This answer was cut"
    assert openai_server.requests[0].body["max_tokens"] == 5


@pytest.mark.parametrize(("asked", "sent"), [(None, 64), (10, 10), (1000, 64)])
async def test_the_configured_max_tokens_caps_what_a_request_asks_for(
    openai_server: OpenAIServer, asked: int | None, sent: int
) -> None:
    openai_server.script(json_reply(completion_body("ok")))
    llm = OpenAIClient("m", base_url=openai_server.base_url, api_key="k", max_tokens=64)
    try:
        await llm.complete(LLMRequest(messages=HELLO.messages, max_tokens=asked))
    finally:
        await llm.aclose()
    assert openai_server.requests[0].body["max_tokens"] == sent


async def test_the_legacy_function_call_field_becomes_a_tool_call(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunk = {
        "id": "r",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"function_call": {"name": "read_file", "arguments": '{"path": "x"}'}},
                "finish_reason": "function_call",
            }
        ],
    }
    openai_server.script(
        sse_reply([chunk]),
        json_reply(completion_body(None, function_call=("read_file", '{"path": "y"}'))),
    )

    streamed = await final_completion(client.stream(WITH_TOOLS))
    whole = await client.complete(WITH_TOOLS)

    for completion, path in ((streamed, "x"), (whole, "y")):
        assert completion.finish_reason == "tool_calls"
        (tool_call,) = completion.tool_calls
        assert tool_call.name == "read_file"
        assert tool_call.parsed_arguments == {"path": path}
        assert tool_call.id


async def test_chunks_with_empty_choices_and_trailing_whitespace_are_normalized(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    filter_results = {"id": "", "model": "", "choices": [], "prompt_filter_results": []}
    fragments = tool_call_chunks([("c9", "read_file", '  {"path": "p"}  \n')])[1:-2]
    text = text_chunks("  Hello.\n\n\n")
    chunks = [filter_results, *text[:-2], *fragments, *text[-2:]]
    openai_server.script(sse_reply(chunks))

    completion = await final_completion(client.stream(WITH_TOOLS))

    assert completion.text == "Hello."
    assert completion.response_id == "chatcmpl-test"
    (tool_call,) = completion.tool_calls
    assert tool_call.arguments == '{"path": "p"}'
    assert tool_call.parsed_arguments == {"path": "p"}


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_fields_surface_as_thinking_chunks(
    openai_server: OpenAIServer, client: OpenAIClient, field: str
) -> None:
    chunks = text_chunks("42.", reasoning="Six times seven.", reasoning_field=field)
    openai_server.script(sse_reply(chunks))

    events = await collect(client.stream(HELLO))

    thinking = "".join(e.text for e in events if isinstance(e, ThinkingChunk))
    assert thinking == "Six times seven."
    assert texts(events) == "42."
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.thinking == "Six times seven."
    assert completion.text == "42."


async def test_a_server_that_ignores_stream_and_answers_json_is_read_whole(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(json_reply(completion_body("whole answer")))

    events = await collect(client.stream(HELLO))

    assert texts(events) == "whole answer"
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.text == "whole answer"


async def test_breaking_out_of_a_stream_early_releases_the_connection(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(
        sse_reply(text_chunks("a b c d e f g", chunk_size=1)), sse_reply(text_chunks("ok"))
    )

    stream = client.stream(HELLO)
    async for event in stream:
        assert isinstance(event, TextChunk)
        break
    await stream.aclose()  # type: ignore[attr-defined]

    assert (await final_completion(client.stream(HELLO))).text == "ok"


# -- streams that go wrong ------------------------------------------------------------------


async def test_a_connection_dropped_mid_stream_raises_model_connection_error_after_the_chunks(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(sse_reply(text_chunks("abcdefghij", chunk_size=2), drop_after=3))
    client.max_retries = 0
    seen: list[StreamEvent] = []

    with pytest.raises(ModelConnectionError, match="lost mid-answer") as caught:
        await drain_into(client.stream(HELLO), seen)

    assert texts(seen) == "abcd"
    assert not any(isinstance(e, Completion) for e in seen)
    assert caught.value.retryable
    assert caught.value.attempts == 1
    assert len(openai_server.requests) == 1


async def test_a_stream_that_ends_without_a_finish_reason_raises_incomplete_stream_error(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(sse_reply(text_chunks("half an ans", finish_reason=None)))
    client.max_retries = 0

    with pytest.raises(IncompleteStreamError, match="without a finish reason"):
        await collect(client.stream(HELLO))


async def test_a_tool_call_stream_cut_before_its_finish_reason_is_an_error_not_a_short_call(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunks = tool_call_chunks([("c1", "read_file", '{"path": "a.py"}')], finish_reason=None)
    openai_server.script(sse_reply(chunks[:-2], done=False))
    client.max_retries = 0

    with pytest.raises(IncompleteStreamError, match="1 tool call"):
        await collect(client.stream(WITH_TOOLS))


@pytest.mark.parametrize("corrupt", ["{not json", '{"choices": [', b"\xff\xfe not utf-8"])
async def test_a_chunk_that_is_not_valid_json_raises_malformed_chunk_error(
    openai_server: OpenAIServer, client: OpenAIClient, corrupt: str | bytes
) -> None:
    chunks: list[object] = list(text_chunks("fine so far"))
    chunks.insert(2, corrupt)
    openai_server.script(sse_reply(chunks))

    with pytest.raises(MalformedChunkError, match="chunk 3 of the stream"):
        await collect(client.stream(HELLO))


async def test_a_chunk_that_is_json_but_not_an_object_raises_malformed_chunk_error(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(sse_reply(["[1, 2, 3]"]))

    with pytest.raises(MalformedChunkError, match="not an object"):
        await collect(client.stream(HELLO))


async def test_an_error_event_inside_a_stream_raises_model_response_error(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    error = {"error": {"message": "the model crashed", "type": "server_error", "code": "oops"}}
    openai_server.script(sse_reply([text_chunks("part")[1], error]))

    with pytest.raises(ModelResponseError, match=r"mid-answer \(oops\): the model crashed"):
        await collect(client.stream(HELLO))


# -- HTTP errors and retries ----------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_429_then_success_is_retried_by_the_sdk_and_succeeds(
    openai_server: OpenAIServer, client: OpenAIClient, streaming: bool
) -> None:
    ok = (
        sse_reply(text_chunks("after the wait"))
        if streaming
        else json_reply(completion_body("after the wait"))
    )
    openai_server.script(error_reply(429, "slow down", code="rate_limit_exceeded"), ok)

    if streaming:
        completion = await final_completion(client.stream(HELLO))
    else:
        completion = await client.complete(HELLO)

    assert completion.text == "after the wait"
    assert len(openai_server.requests) == 2
    # One retry layer: agent_flow's (the SDK's own is off, so it counts no retry).
    assert openai_server.requests[1].headers["x-stainless-retry-count"] == "0"


async def test_a_persistent_429_ends_in_model_rate_limit_error_with_status_code_and_body(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(*[error_reply(429, "slow down", code="rate_limit_exceeded")] * 3)

    with pytest.raises(ModelRateLimitError) as caught:
        await client.complete(HELLO)

    error = caught.value
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert isinstance(error.body, dict)
    assert error.body["message"] == "slow down"
    assert error.retryable
    assert "gave up after 3 attempts" in str(error)
    assert error.attempts == 3
    assert len(openai_server.requests) == 3


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_persistent_500_ends_in_model_server_error_after_the_retries(
    openai_server: OpenAIServer, client: OpenAIClient, streaming: bool
) -> None:
    openai_server.script(
        *[error_reply(500, f"boom {n}", type="server_error", code=None) for n in range(3)]
    )

    attempt = collect(client.stream(HELLO)) if streaming else client.complete(HELLO)

    with pytest.raises(ModelServerError, match="HTTP 500") as caught:
        await attempt

    assert caught.value.status_code == 500
    assert caught.value.code == "server_error"  # the error type stands in for a missing code
    assert len(openai_server.requests) == 3


async def test_a_500_then_success_is_retried_by_the_sdk(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(error_reply(500), sse_reply(text_chunks("fine")))

    assert (await final_completion(client.stream(HELLO))).text == "fine"
    assert len(openai_server.requests) == 2


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, ModelBadRequestError),
        (401, ModelAuthenticationError),
        (403, ModelAuthenticationError),
        (404, ModelBadRequestError),
        (422, ModelBadRequestError),
        (429, ModelRateLimitError),
        (500, ModelServerError),
        (503, ModelServerError),
    ],
)
async def test_each_http_error_status_maps_to_its_agent_flow_error(
    openai_server: OpenAIServer, status: int, error_type: type[ModelError]
) -> None:
    openai_server.script(error_reply(status, f"status {status}", code=f"code_{status}"))
    llm = OpenAIClient("m", base_url=openai_server.base_url, api_key=SECRET, max_retries=0)
    try:
        with pytest.raises(error_type) as caught:
            await llm.complete(HELLO)
    finally:
        await llm.aclose()

    assert type(caught.value) is error_type
    assert caught.value.status_code == status  # type: ignore[attr-defined]
    assert caught.value.code == f"code_{status}"  # type: ignore[attr-defined]
    assert f"status {status}" in str(caught.value)


async def test_client_errors_are_not_retried(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(error_reply(401, "bad key", code="invalid_api_key"), error_reply(400))

    with pytest.raises(ModelAuthenticationError, match="OPENAI_API_KEY"):
        await client.complete(HELLO)
    with pytest.raises(ModelBadRequestError):
        await client.complete(HELLO)

    assert len(openai_server.requests) == 2


async def test_the_api_key_never_appears_in_errors_reprs_or_bodies(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    echo = f"Incorrect API key provided: {SECRET}."
    openai_server.script(error_reply(401, echo, code="invalid_api_key"))

    with pytest.raises(ModelAuthenticationError) as caught:
        await client.complete(HELLO)

    error = caught.value
    assert SECRET not in str(error)
    assert SECRET not in repr(error)
    assert SECRET not in json.dumps(error.body)
    assert "[redacted]" in str(error)
    assert SECRET not in repr(client)
    assert SECRET not in str(vars(client))


async def test_an_unreachable_server_raises_model_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        llm = OpenAIClient("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        try:
            with pytest.raises(ModelConnectionError, match="could not reach"):
                await llm.complete(HELLO)
        finally:
            await llm.aclose()


async def test_a_server_that_does_not_answer_in_time_raises_model_timeout_error(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(Reply(hang=True))
    llm = OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", timeout=0.2, max_retries=0
    )
    try:
        with pytest.raises(ModelTimeoutError, match=r"request timeout of 0.2 s"):
            await collect(llm.stream(HELLO))
    finally:
        await llm.aclose()


async def test_a_non_streamed_answer_with_no_choices_raises_model_response_error(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(json_reply({"id": "x", "choices": [], "model": "m"}))

    with pytest.raises(ModelResponseError, match="no choices"):
        await client.complete(HELLO)


# -- server quirks ----------------------------------------------------------------------------


def rejects_stream_options(request: RecordedRequest) -> Reply:
    if "stream_options" in request.body:
        return error_reply(400, "Unrecognized request argument supplied: stream_options")
    return sse_reply(text_chunks("no usage here", usage=None))


async def test_a_server_rejecting_stream_options_is_asked_again_without_them_once(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(rejects_stream_options, rejects_stream_options, rejects_stream_options)

    first = await collect(client.stream(HELLO))
    second = await collect(client.stream(HELLO))

    (warning,) = [e for e in first if isinstance(e, StreamWarning)]
    assert warning.code == "stream_options_rejected"
    completion = first[-1]
    assert isinstance(completion, Completion)
    assert completion.text == "no usage here"
    assert completion.warnings == (warning.message,)
    assert completion.usage is None
    assert not any(isinstance(e, StreamWarning) for e in second)
    assert ["stream_options" in body for body in openai_server.bodies] == [True, False, False]


def rejects_stream_with_tools(request: RecordedRequest) -> Reply:
    body = request.body
    if body.get("stream") and body.get("tools"):
        return error_reply(400, "Cannot use tools with stream", retry_after_ms=None)
    return json_reply(
        completion_body("Reading.", tool_calls=[("c1", "read_file", '{"path": "a.py"}')])
    )


async def test_a_server_rejecting_streams_with_tools_falls_back_to_a_non_streamed_call(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.handler = rejects_stream_with_tools

    events = await collect(client.stream(WITH_TOOLS))
    again = await collect(client.stream(WITH_TOOLS))

    (warning,) = [e for e in events if isinstance(e, StreamWarning)]
    assert warning.code == "stream_with_tools_unsupported"
    assert texts(events) == "Reading."
    started = [e for e in events if isinstance(e, ToolCallChunk)]
    assert [(s.id, s.name) for s in started] == [("c1", "read_file")]
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.tool_calls[0].parsed_arguments == {"path": "a.py"}
    assert completion.warnings == (warning.message,)
    assert any(isinstance(e, StreamWarning) for e in again)  # each fallback is reported
    # The rejection is remembered: the second call went straight to a non-streamed request.
    assert [bool(body.get("stream")) for body in openai_server.bodies] == [True, False, False]


# -- requests -------------------------------------------------------------------------------


async def test_neutral_messages_and_settings_are_converted_to_the_wire_format(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(json_reply(completion_body("ok")))
    llm = OpenAIClient(
        "default-model",
        base_url=openai_server.base_url,
        api_key="k",
        headers={"X-Team": "agents"},
        organization="org-1",
        temperature=0.3,
        max_tokens_field="max_completion_tokens",
        extra_body={"top_k": 5, "seed": 1},
    )
    request = LLMRequest(
        messages=[
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Read a.py", name="ana"),
            ChatMessage(
                role="assistant",
                tool_calls=(ToolCall(id="c1", name="read_file", arguments='{"path":"a.py"}'),),
            ),
            ChatMessage(role="tool", content="print(1)", tool_call_id="c1", name="read_file"),
        ],
        tools=[READ_FILE],
        model="override-model",
        max_tokens=64,
        stop=("END",),
        tool_choice="read_file",
        parallel_tool_calls=False,
        extra_body={"seed": 7},
    )
    try:
        await llm.complete(request)
    finally:
        await llm.aclose()

    recorded = openai_server.requests[0]
    body = recorded.body
    assert recorded.path == "/v1/chat/completions"
    assert body == llm.build_body(request, stream=False)
    assert body["model"] == "override-model"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Read a.py", "name": "ana"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "read_file"}}
    assert body["parallel_tool_calls"] is False
    assert body["temperature"] == 0.3
    assert body["max_completion_tokens"] == 64
    assert "max_tokens" not in body
    assert body["stop"] == ["END"]
    assert body["top_k"] == 5
    assert body["seed"] == 7  # the request's extra_body wins over the client's
    assert "stream" not in body
    assert recorded.headers["x-team"] == "agents"
    assert recorded.headers["openai-organization"] == "org-1"


async def test_a_non_streamed_answer_is_normalized_like_a_stream(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    body = completion_body(
        "  Let me read both.  ",
        tool_calls=[(None, "read_file", {"path": "a.py"}), (None, "read_file", "")],
        finish_reason="stop",
        usage=(50, 10),
        cached=40,
        reasoning_tokens=3,
        reasoning="First a, then b.",
    )
    openai_server.script(json_reply(body))

    completion = await client.complete(WITH_TOOLS)

    assert completion.text == "Let me read both."
    assert completion.thinking == "First a, then b."
    assert completion.finish_reason == "tool_calls"
    first, second = completion.tool_calls
    assert first.arguments == '{"path": "a.py"}'  # an object instead of a string: serialized
    assert first.parsed_arguments == {"path": "a.py"}
    assert second.arguments == "{}"  # nothing at all: no arguments
    assert second.parsed_arguments == {}
    assert first.id != second.id
    assert completion.usage is not None
    assert (completion.usage.cached_tokens, completion.usage.reasoning_tokens) == (40, 3)


async def test_the_api_key_is_read_from_the_named_environment_variable(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_PROVIDER_KEY", "from-env")
    openai_server.script(json_reply(completion_body("ok")))
    llm = OpenAIClient("m", base_url=openai_server.base_url, api_key_env="MY_PROVIDER_KEY")
    try:
        await llm.complete(HELLO)
    finally:
        await llm.aclose()

    assert openai_server.requests[0].headers["authorization"] == "Bearer from-env"


def test_openai_itself_without_a_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIClient("gpt-4o-mini")


async def test_a_local_server_needs_no_key(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    openai_server.script(json_reply(completion_body("local")))
    llm = OpenAIClient("llama3")
    try:
        assert (await llm.complete(HELLO)).text == "local"
    finally:
        await llm.aclose()
    assert llm.base_url == openai_server.base_url + "/"


async def test_an_azure_sdk_client_is_used_as_given_and_routes_to_the_deployment(
    openai_server: OpenAIServer,
) -> None:
    from openai import AsyncAzureOpenAI

    azure = AsyncAzureOpenAI(
        azure_endpoint=f"http://127.0.0.1:{openai_server.port}",
        api_key="azure-key",
        api_version="2024-10-21",
        max_retries=0,
    )
    openai_server.script(sse_reply(text_chunks("from azure")))
    llm = OpenAIClient("my-deployment", sdk_client=azure)
    try:
        completion = await final_completion(llm.stream(HELLO))
    finally:
        await azure.close()

    assert completion.text == "from azure"
    recorded = openai_server.requests[0]
    assert recorded.path.startswith("/openai/deployments/my-deployment/chat/completions")
    assert recorded.headers["api-key"] == "azure-key"
    assert recorded.body["messages"] == [{"role": "user", "content": "hi"}]


def test_an_sdk_client_cannot_be_combined_with_connection_arguments() -> None:
    from openai import AsyncOpenAI

    with pytest.raises(ConfigError, match="sdk_client was given together with base_url"):
        OpenAIClient("m", sdk_client=AsyncOpenAI(api_key="k"), base_url="http://x/v1")


async def test_a_connection_lost_after_the_finish_reason_keeps_the_complete_answer(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunks = text_chunks("complete answer")
    openai_server.script(sse_reply(chunks, drop_after=len(chunks) - 1))  # usage and [DONE] lost

    events = await collect(client.stream(HELLO))

    (warning,) = [e for e in events if isinstance(e, StreamWarning)]
    assert warning.code == "connection_lost_after_answer"
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.text == "complete answer"
    assert completion.usage is None
    assert completion.warnings == (warning.message,)


async def test_whole_tool_calls_without_index_or_id_are_kept_apart(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunks = tool_call_chunks(
        [(None, "read_file", '{"path": "a.py"}'), (None, "list_dir", "{}")],
        chunk_size=100,
        with_index=False,
    )
    openai_server.script(sse_reply(chunks))

    completion = await final_completion(client.stream(WITH_TOOLS))

    assert [(c.name, c.parsed_arguments) for c in completion.tool_calls] == [
        ("read_file", {"path": "a.py"}),
        ("list_dir", {}),
    ]
    assert len({c.id for c in completion.tool_calls}) == 2
