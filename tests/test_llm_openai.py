"""OpenAIClient through the real AsyncOpenAI SDK, over real HTTP, against a scripted server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.errors import (
    IncompleteStreamError,
    MalformedChunkError,
    ModelConnectionError,
    ModelResponseError,
)
from agent_flow.llm import (
    Completion,
    LLMRequest,
    OpenAIClient,
    RetryNotice,
    StreamEvent,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    final_completion,
)
from agent_flow.messages import ChatMessage, ToolCall
from tests.helpers import drain_into
from tests.openai_client_helpers import HELLO, READ_FILE, SECRET, WITH_TOOLS, client, collect, texts
from tests.openai_server import (
    OpenAIServer,
    completion_body,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

__all__ = ["client"]  # fixtures

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
async def test_a_chunk_that_is_not_valid_json_raises_a_retryable_malformed_chunk_error(
    openai_server: OpenAIServer, client: OpenAIClient, corrupt: str | bytes
) -> None:
    chunks: list[object] = list(text_chunks("fine so far"))
    chunks.insert(2, corrupt)
    openai_server.script(sse_reply(chunks))
    client.max_retries = 0

    with pytest.raises(MalformedChunkError, match="chunk 3 of the stream") as caught:
        await collect(client.stream(HELLO))
    assert caught.value.retryable


async def test_a_chunk_that_is_json_but_not_an_object_raises_a_retryable_malformed_chunk_error(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(sse_reply(["[1, 2, 3]"]))
    client.max_retries = 0

    with pytest.raises(MalformedChunkError, match="not an object") as caught:
        await collect(client.stream(HELLO))
    assert caught.value.retryable


# The README's "Retries": a stream cut or corrupted mid-answer is tried again. The faulty
# attempt streams some of its chunks first, then ends without a finish reason, or sends a
# chunk that is not JSON (or JSON that is not an object).
_FAULTS = {
    "cut": ("IncompleteStreamError", lambda good: sse_reply(good, done=False)),
    "corrupt": ("MalformedChunkError", lambda good: sse_reply([*good, "{not json"])),
    "not an object": ("MalformedChunkError", lambda good: sse_reply([*good, "[1]"])),
}


@settings(max_examples=24)
@given(
    fault=st.sampled_from(sorted(_FAULTS)),
    streamed=st.integers(min_value=0, max_value=5),
    answer=st.text(alphabet="abcxyz ", min_size=1, max_size=12).filter(str.strip),
)
async def test_a_stream_cut_or_corrupted_mid_answer_is_tried_again_and_its_chunks_voided(
    fault: str, streamed: int, answer: str
) -> None:
    error_type, faulty = _FAULTS[fault]
    first = text_chunks("the first try", chunk_size=3, finish_reason=None, usage=None)
    async with OpenAIServer() as server:
        server.script(faulty(first[:streamed]), sse_reply(text_chunks(answer)))
        async with OpenAIClient("m", base_url=server.base_url, api_key="k") as client:
            client.retry_base_delay = 0.001
            events = await collect(client.stream(HELLO))
        requests = len(server.requests)

    (notice,) = [e for e in events if isinstance(e, RetryNotice)]
    assert (notice.attempt, notice.max_attempts, notice.error_type) == (1, 3, error_type)
    before = events[: events.index(notice)]
    # The voided chunks are exactly those the faulty attempt streamed, and said to be.
    assert notice.discarded == any(isinstance(e, TextChunk) and e.text for e in before)
    assert texts(before) == "the first try"[: 3 * max(0, streamed - 1)]
    assert texts(events[events.index(notice) :]) == answer
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.text == answer.strip()
    assert requests == 2


async def test_the_same_corrupt_chunk_twice_is_not_tried_a_third_time(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    corrupt = sse_reply([*text_chunks("so far", finish_reason=None, usage=None), "{not"])
    openai_server.script(corrupt, corrupt, sse_reply(text_chunks("never asked")))
    client.retry_base_delay = 0.001

    with pytest.raises(MalformedChunkError, match="identical request failed identically") as caught:
        await collect(client.stream(HELLO))
    assert caught.value.attempts == 2
    assert len(openai_server.requests) == 2


async def test_an_error_event_inside_a_stream_raises_model_response_error(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    error = {"error": {"message": "the model crashed", "type": "server_error", "code": "oops"}}
    openai_server.script(sse_reply([text_chunks("part")[1], error]))

    with pytest.raises(ModelResponseError, match=r"mid-answer \(oops\): the model crashed"):
        await collect(client.stream(HELLO))
