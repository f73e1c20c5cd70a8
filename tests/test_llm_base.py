"""The neutral LLM data model: requests, completions, stream chunks, argument parsing."""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow.errors import ModelResponseError
from agent_flow.llm import (
    STREAM_EVENT_ADAPTER,
    Completion,
    LLMClient,
    LLMRequest,
    OpenAIClient,
    RetryNotice,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
    completion_events,
    final_completion,
    normalize_finish_reason,
)
from agent_flow.messages import ChatMessage, ToolCall, parse_tool_arguments
from agent_flow.testing import FunctionLLM, ScriptedLLM


@pytest.mark.parametrize(
    ("raw", "parsed", "problem"),
    [
        ('{"path": "a.py"}', {"path": "a.py"}, None),
        ('  {"n": 1}\n', {"n": 1}, None),
        ("", {}, None),
        ("   ", {}, None),
        ("[1, 2]", None, "the arguments must be a JSON object, not a JSON array"),
        ('"text"', None, "the arguments must be a JSON object, not a JSON string"),
        ("3", None, "the arguments must be a JSON object, not a JSON number"),
        ("null", None, "the arguments must be a JSON object, not a JSON null"),
        ("true", None, "the arguments must be a JSON object, not a JSON boolean"),
        (
            '{"path": ',
            None,
            "the arguments are not valid JSON (Expecting value at character 8); send a JSON object",
        ),
    ],
)
def test_tool_arguments_parse_to_an_object_or_a_one_sentence_problem(
    raw: str, parsed: dict[str, object] | None, problem: str | None
) -> None:
    assert parse_tool_arguments(raw) == (parsed, problem)


def test_deeply_nested_arguments_are_a_problem_not_a_crash() -> None:
    parsed, problem = parse_tool_arguments("[" * 100_000 + "]" * 100_000)

    assert parsed is None
    assert problem is not None


def test_a_tool_call_keeps_its_raw_text_and_says_whether_it_is_valid() -> None:
    good = ToolCall.from_raw("c1", "read_file", ' {"path": "a"} ')
    broken = ToolCall.from_raw("c2", "read_file", "{")
    nameless = ToolCall.from_raw("c3", "", "{}")
    empty = ToolCall.from_raw("c4", "ls", "")

    assert (good.arguments, good.parsed_arguments, good.is_valid) == (
        '{"path": "a"}',
        {"path": "a"},
        True,
    )
    assert (broken.arguments, broken.parsed_arguments, broken.is_valid) == ("{", None, False)
    assert nameless.parse_error == "the tool call has no tool name"
    assert (empty.arguments, empty.parsed_arguments) == ("{}", {})
    assert good == ToolCall(id="c1", name="read_file", arguments='{"path": "a"}')


def test_a_double_encoded_object_is_decoded_once_more_by_the_one_parser() -> None:
    assert parse_tool_arguments('"{\\"path\\": \\"a\\"}"') == ({"path": "a"}, None)


def test_a_problem_the_reader_found_is_the_calls_verdict_and_is_not_persisted() -> None:
    call = ToolCall.from_raw("c1", "read_file", '{"path": "a"}', problem="the XML block is cut")

    assert (call.parsed_arguments, call.parse_error) == (None, "the XML block is cut")
    assert "problem" not in call.model_dump()


def test_a_completion_becomes_the_assistant_message_of_the_next_prompt() -> None:
    completion = Completion(
        text="Reading.",
        tool_calls=(ToolCall.from_raw("c1", "read_file", "{bad"),),
        finish_reason="tool_calls",
    )

    assert completion.to_message() == ChatMessage(
        role="assistant",
        content="Reading.",
        tool_calls=(ToolCall(id="c1", name="read_file", arguments="{bad"),),
    )


def test_usage_adds_up_and_keeps_unreported_details_unreported() -> None:
    a = Usage(prompt_tokens=10, completion_tokens=2, total_tokens=12)
    b = Usage(prompt_tokens=5, completion_tokens=1, total_tokens=6, cached_tokens=4)

    assert a + a == Usage(prompt_tokens=20, completion_tokens=4, total_tokens=24)
    assert (a + b).cached_tokens == 4
    assert (a + b).reasoning_tokens is None


@given(
    prompt=st.integers(min_value=0, max_value=10**9),
    completion=st.integers(min_value=0, max_value=10**9),
)
def test_usage_total_is_derived_when_a_client_does_not_fill_it(
    prompt: int, completion: int
) -> None:
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion)

    assert usage.total_tokens == prompt + completion
    assert Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=0) == usage
    assert Usage.model_validate_json(usage.model_dump_json()) == usage
    assert (usage + usage).total_tokens == 2 * (prompt + completion)


def test_usage_keeps_a_total_the_server_reported() -> None:
    # Some providers count more than prompt + completion (e.g. tool-use overhead).
    assert Usage(prompt_tokens=3, completion_tokens=4, total_tokens=9).total_tokens == 9


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("stop", "stop"),
        (None, "stop"),
        ("eos", "stop"),
        ("end_turn", "stop"),
        ("length", "length"),
        ("max_tokens", "length"),
        ("tool_calls", "tool_calls"),
        ("function_call", "tool_calls"),
        ("content_filter", "content_filter"),
        ("recitation", "other"),
    ],
)
def test_finish_reasons_of_many_servers_map_onto_a_closed_set(raw: str | None, reason: str) -> None:
    assert normalize_finish_reason(raw) == reason


EXAMPLES: list[StreamEvent] = [
    TextChunk(text="hi"),
    ThinkingChunk(text="hmm"),
    ToolCallChunk(index=0, id="c1", name="ls"),
    ToolCallArgumentsChunk(index=0, id="c1", delta='{"a"'),
    StreamWarning(code="stream_options_rejected", message="no usage"),
    RetryNotice(attempt=1, max_attempts=3, delay=0.5, reason="HTTP 503", discarded=True),
    Completion(
        text="done",
        tool_calls=(ToolCall.from_raw("c1", "ls", '{"a": [1, {"b": null}]}'),),
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3, cached_tokens=0),
        warnings=("w",),
    ),
]


def test_every_stream_event_class_is_in_the_union_and_round_trips_through_json() -> None:
    union = typing.get_args(typing.get_args(StreamEvent)[0])
    assert {type(e) for e in EXAMPLES} == set(union)
    for event in EXAMPLES:
        assert STREAM_EVENT_ADAPTER.validate_json(STREAM_EVENT_ADAPTER.dump_json(event)) == event


completions = st.builds(
    Completion,
    text=st.text(max_size=60),
    thinking=st.text(max_size=30),
    tool_calls=st.lists(
        st.builds(
            ToolCall.from_raw,
            id=st.uuids().map(str),
            name=st.sampled_from(["ls", "read_file"]),
            arguments=st.text(max_size=40),
        ),
        max_size=3,
    ).map(tuple),
    warnings=st.lists(st.text(max_size=10), max_size=2).map(tuple),
)


@given(completion=completions, chunk_size=st.one_of(st.none(), st.integers(1, 9)))
def test_replaying_a_completion_as_chunks_reassembles_to_the_completion(
    completion: Completion, chunk_size: int | None
) -> None:
    events = list(completion_events(completion, chunk_size=chunk_size))

    assert events[-1] is completion
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == completion.text
    assert "".join(e.text for e in events if isinstance(e, ThinkingChunk)) == completion.thinking
    started = [e for e in events if isinstance(e, ToolCallChunk)]
    assert [(s.id, s.name) for s in started] == [(c.id, c.name) for c in completion.tool_calls]
    for index, call in enumerate(completion.tool_calls):
        pieces = [
            e.delta for e in events if isinstance(e, ToolCallArgumentsChunk) and e.index == index
        ]
        assert "".join(pieces) == call.arguments
    if chunk_size is not None:
        assert all(len(e.text) <= chunk_size for e in events if isinstance(e, TextChunk))


async def test_final_completion_drains_a_stream_and_insists_on_its_completion() -> None:
    async def good() -> AsyncIterator[StreamEvent]:
        yield TextChunk(text="a")
        yield Completion(text="a")

    async def truncated() -> AsyncIterator[StreamEvent]:
        yield TextChunk(text="a")

    assert (await final_completion(good())).text == "a"
    with pytest.raises(ModelResponseError, match="without a final completion"):
        await final_completion(truncated())


async def test_every_client_implements_the_llm_client_protocol() -> None:
    openai_client = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    try:
        for client in (openai_client, ScriptedLLM(), FunctionLLM(lambda request: "hi")):
            assert isinstance(client, LLMClient)
    finally:
        await openai_client.aclose()


def test_a_request_validates_its_settings() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        LLMRequest(messages=[], max_tokens=0)
    request = LLMRequest(messages=[ChatMessage(role="user", content="x")], stop=["a"])
    assert request.stop == ("a",)
    assert isinstance(request.messages, tuple)


def test_the_public_names_of_the_llm_package_are_exported_once_and_importable() -> None:
    import agent_flow.llm as llm
    import agent_flow.testing as testing

    for module in (llm, testing):
        assert len(module.__all__) == len(set(module.__all__))
        for name in module.__all__:
            assert getattr(module, name) is not None, name
