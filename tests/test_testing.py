"""The model doubles of agent_flow.testing: ScriptedLLM and FunctionLLM."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow.errors import ModelRateLimitError, UserError
from agent_flow.llm import (
    Completion,
    LLMRequest,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
    final_completion,
)
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from agent_flow.testing import (
    FunctionLLM,
    Reply,
    ScriptedLLM,
    ScriptExhaustedError,
    call,
    fail,
    reply,
)
from agent_flow.tokens import ApproxCounter
from tests.helpers import drain_into

ASK = LLMRequest(messages=[ChatMessage(role="user", content="Explore the project.")])


def ask(text: str) -> LLMRequest:
    return LLMRequest(messages=[ChatMessage(role="user", content=text)])


async def stream_all(llm: ScriptedLLM | FunctionLLM, request: LLMRequest) -> list[StreamEvent]:
    return [event async for event in llm.stream(request)]


async def test_a_script_is_answered_in_order_and_every_request_is_recorded() -> None:
    llm = ScriptedLLM(
        [
            reply("Let me look.", tool_calls=[call("read_file", path="a.py")]),
            "It prints hello.",
        ]
    )

    first = await llm.complete(ask("one"))
    second = await llm.complete(ask("two"))

    assert first.text == "Let me look."
    assert first.finish_reason == "tool_calls"
    (tool_call,) = first.tool_calls
    assert (tool_call.id, tool_call.name, tool_call.parsed_arguments) == (
        "call_1",
        "read_file",
        {"path": "a.py"},
    )
    assert second == Completion(
        text="It prints hello.",
        finish_reason="stop",
        raw_finish_reason="stop",
        usage=second.usage,
        model="scripted",
        response_id="scripted-2",
    )
    assert [r.messages[0].content for r in llm.requests] == ["one", "two"]
    assert llm.last_request is llm.requests[-1]
    llm.assert_all_consumed()


async def test_a_script_that_runs_out_says_which_call_had_no_step() -> None:
    llm = ScriptedLLM(["only one"])
    await llm.complete(ASK)

    with pytest.raises(ScriptExhaustedError, match=r"call #2 but its script had only 1 step"):
        await llm.complete(ask("and another?"))
    with pytest.raises(ScriptExhaustedError, match="and another"):
        await final_completion(llm.stream(ask("and another?")))


async def test_unused_steps_fail_assert_all_consumed() -> None:
    llm = ScriptedLLM(["a", "b", reply("c")])
    await llm.complete(ASK)

    with pytest.raises(AssertionError, match="used 1 of its 3 steps; 2 were never reached"):
        llm.assert_all_consumed()
    llm.add("d")
    assert llm.remaining == 3


def test_call_builds_arguments_from_keywords_a_dict_or_raw_text() -> None:
    assert json.loads(call("search", query="x", limit=3).arguments) == {"query": "x", "limit": 3}
    assert json.loads(call("f", {"raw": 1, "call_id": 2}).arguments) == {"raw": 1, "call_id": 2}
    assert call("f", raw='{"broken"').arguments == '{"broken"'
    assert call("f", call_id="mine").id == "mine"
    with pytest.raises(UserError, match="both raw= and structured arguments"):
        call("f", raw="{}", x=1)


async def test_scripted_tool_calls_can_be_invalid_and_ids_never_collide_with_the_prompt() -> None:
    llm = ScriptedLLM([reply(tool_calls=[call("write_file", raw='{"path": '), call("ls")])])
    request = LLMRequest(
        messages=[
            ChatMessage(role="user", content="go"),
            ChatMessage(role="assistant", tool_calls=(ToolCall(id="call_1", name="ls"),)),
            ChatMessage(role="tool", content="[]", tool_call_id="call_1"),
        ]
    )

    completion = await llm.complete(request)

    broken, listing = completion.tool_calls
    assert broken.parse_error is not None
    assert broken.arguments == '{"path":'
    assert listing.parsed_arguments == {}
    assert [c.id for c in completion.tool_calls] == ["call_2", "call_3"]


async def test_a_scripted_failure_raises_and_a_streamed_one_sends_its_partial_text_first() -> None:
    error = ModelRateLimitError("slow down", status_code=429)
    llm = ScriptedLLM([fail(error), fail(error, partial_text="I was saying")])

    with pytest.raises(ModelRateLimitError) as caught:
        await llm.complete(ASK)
    assert caught.value is error

    seen: list[StreamEvent] = []
    with pytest.raises(ModelRateLimitError):
        await drain_into(llm.stream(ASK), seen)
    assert "".join(e.text for e in seen if isinstance(e, TextChunk)) == "I was saying"
    assert not any(isinstance(e, Completion) for e in seen)


async def test_a_streamed_reply_arrives_as_chunks_ending_with_its_completion() -> None:
    llm = ScriptedLLM(
        [
            reply(
                "I will read two files.",
                thinking="Start with the entry point.",
                tool_calls=[call("read_file", path="main.py"), call("read_file", path="util.py")],
                warnings=["scripted warning"],
            )
        ],
        chunk_size=4,
    )

    events = await stream_all(llm, ASK)

    assert isinstance(events[0], StreamWarning)
    texts = [e.text for e in events if isinstance(e, TextChunk)]
    assert all(len(t) <= 4 for t in texts)
    assert "".join(texts) == "I will read two files."
    assert "".join(e.text for e in events if isinstance(e, ThinkingChunk)) == (
        "Start with the entry point."
    )
    started = [e for e in events if isinstance(e, ToolCallChunk)]
    assert [(s.index, s.id) for s in started] == [(0, "call_1"), (1, "call_2")]
    second_args = [
        e.delta for e in events if isinstance(e, ToolCallArgumentsChunk) and e.index == 1
    ]
    assert json.loads("".join(second_args)) == {"path": "util.py"}
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.warnings == ("scripted warning",)
    llm.assert_all_consumed()


async def test_by_default_streams_go_word_by_word() -> None:
    llm = ScriptedLLM(["one two  three"])

    events = await stream_all(llm, ASK)

    assert [e.text for e in events if isinstance(e, TextChunk)] == ["one ", "two  ", "three"]


async def test_usage_is_estimated_with_the_token_counter_unless_scripted() -> None:
    counter = ApproxCounter()
    tool = ToolDefinition(name="ls", description="List files.")
    request = LLMRequest(messages=ASK.messages, tools=[tool])
    fixed = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    llm = ScriptedLLM(["Twelve chars", reply("x", usage=fixed)], counter=counter)

    estimated = (await llm.complete(request)).usage
    scripted = (await llm.complete(request)).usage

    assert estimated == Usage(
        prompt_tokens=counter.count_messages(ASK.messages) + counter.count_tools([tool]),
        completion_tokens=counter.count("Twelve chars"),
        total_tokens=counter.count_messages(ASK.messages)
        + counter.count_tools([tool])
        + counter.count("Twelve chars"),
    )
    assert scripted == fixed


async def test_finish_reasons_default_sensibly_and_can_be_scripted() -> None:
    llm = ScriptedLLM(
        ["plain", reply(tool_calls=[call("ls")]), reply("cut sho", finish_reason="length")]
    )

    reasons = [(await llm.complete(ASK)).finish_reason for _ in range(3)]

    assert reasons == ["stop", "tool_calls", "length"]


async def test_a_step_can_answer_from_the_request_sync_or_async() -> None:
    def echo(request: LLMRequest) -> Reply:
        return f"you said: {request.messages[-1].content}"

    async def shout(request: LLMRequest) -> Reply:
        return reply(request.messages[-1].content.upper())

    llm = ScriptedLLM([echo, shout])

    assert (await llm.complete(ask("hi"))).text == "you said: hi"
    assert (await final_completion(llm.stream(ask("hey")))).text == "HEY"


async def test_a_ready_completion_is_returned_as_is() -> None:
    ready = Completion(text="exact", model="gpt-test", response_id="r1")
    llm = ScriptedLLM([ready])

    assert await llm.complete(ASK) is ready


async def test_a_function_plays_the_model_and_sees_every_request() -> None:
    def model(request: LLMRequest) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            return f"Found: {last.content}"
        return reply(tool_calls=[call("search", query=last.content)])

    llm = FunctionLLM(model)
    first = await llm.complete(ask("weather in Paris"))
    follow_up = LLMRequest(
        messages=[
            *llm.last_request.messages,
            first.to_message(),
            ChatMessage(role="tool", content="sunny", tool_call_id=first.tool_calls[0].id),
        ]
    )
    second = await final_completion(llm.stream(follow_up))

    assert first.tool_calls[0].parsed_arguments == {"query": "weather in Paris"}
    assert second.text == "Found: sunny"
    assert len(llm.requests) == 2
    assert second.model == "function"


async def test_a_function_may_be_async_return_a_failure_or_raise() -> None:
    async def flaky(request: LLMRequest) -> Reply:
        if request.messages[-1].content == "fail":
            return fail(ModelRateLimitError("busy", status_code=429))
        if request.messages[-1].content == "raise":
            raise ValueError("a bug in the test double")
        return "fine"

    llm = FunctionLLM(flaky)

    assert (await llm.complete(ask("ok"))).text == "fine"
    with pytest.raises(ModelRateLimitError):
        await final_completion(llm.stream(ask("fail")))
    with pytest.raises(ValueError, match="a bug"):
        await llm.complete(ask("raise"))


def test_a_chunk_size_below_one_is_refused() -> None:
    with pytest.raises(UserError, match="chunk_size"):
        ScriptedLLM([], chunk_size=0)


@given(texts=st.lists(st.text(max_size=40), min_size=1, max_size=5), size=st.integers(1, 7))
async def test_streaming_and_completing_a_script_give_the_same_answers(
    texts: list[str], size: int
) -> None:
    whole = ScriptedLLM(texts)
    streamed = ScriptedLLM(texts, chunk_size=size)

    for _ in texts:
        expected = await whole.complete(ASK)
        events = await stream_all(streamed, ASK)
        completion = events[-1]
        assert completion == expected
        assert "".join(e.text for e in events if isinstance(e, TextChunk)) == expected.text
