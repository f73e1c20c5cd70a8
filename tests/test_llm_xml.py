"""XML tool-call mode: the incremental parser, prompt conversion, and the client end to end."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow.llm import (
    Completion,
    LLMRequest,
    OpenAIClient,
    StreamEvent,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
)
from agent_flow.llm.xml_tools import (
    XmlPiece,
    XmlToolParser,
    parse_tool_block,
    render_tools_prompt,
    to_xml_messages,
)
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from tests.openai_server import OpenAIServer, completion_body, json_reply, sse_reply, text_chunks

READ_FILE = ToolDefinition(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


def parse(chunks: list[str]) -> list[XmlPiece]:
    parser = XmlToolParser()
    pieces: list[XmlPiece] = []
    for chunk in chunks:
        pieces.extend(parser.feed(chunk))
    pieces.extend(parser.finish())
    return pieces


def joined(pieces: list[XmlPiece], kind: str) -> str:
    return "".join(text for k, text in pieces if k == kind)


def split_at(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# -- the parser -------------------------------------------------------------------------------


def test_the_parser_separates_text_thinking_and_tool_blocks() -> None:
    answer = (
        "<thinking>Need the file.</thinking>I will read it.\n"
        '<tool>\n{"tool_name": "read_file", "arguments": {"path": "a.py"}}\n</tool>\n'
    )

    pieces = parse([answer])

    assert joined(pieces, "thinking") == "Need the file."
    assert joined(pieces, "text") == "I will read it.\n\n"
    assert [t for k, t in pieces if k == "tool"] == [
        '\n{"tool_name": "read_file", "arguments": {"path": "a.py"}}\n'
    ]


def test_angle_brackets_in_ordinary_text_are_text() -> None:
    answer = "if a < b and c > d then <b>bold</b> <toolbox> <th"

    pieces = parse(list(answer))

    assert pieces
    assert all(kind == "text" for kind, _ in pieces)
    assert joined(pieces, "text") == answer


def test_the_think_and_tool_call_spellings_of_open_models_are_understood() -> None:
    answer = '<think>hmm</think>ok<tool_call>{"name": "ls", "arguments": {}}</tool_call>'

    pieces = parse([answer])

    assert joined(pieces, "thinking") == "hmm"
    assert joined(pieces, "text") == "ok"
    assert [t for k, t in pieces if k == "tool"] == ['{"name": "ls", "arguments": {}}']


def test_a_tool_block_never_closed_is_reported_as_unclosed() -> None:
    pieces = parse(["text <tool>", '{"tool_name": "ls", "argu'])

    assert pieces[-1] == ("unclosed_tool", '{"tool_name": "ls", "argu')
    assert joined(pieces, "text") == "text "


plain = st.text(alphabet="ab \n{}\"'>/:.=", min_size=1, max_size=20)
tool_json = st.builds(
    lambda name, value: json.dumps({"tool_name": name, "arguments": {"v": value}}),
    st.sampled_from(["read_file", "ls", "grep"]),
    st.text(alphabet="xyz <>/", max_size=10),
)
segments = st.lists(
    st.one_of(
        plain.map(lambda t: ("text", t)),
        plain.map(lambda t: ("thinking", t)),
        tool_json.map(lambda t: ("tool", t)),
    ),
    max_size=8,
)


@given(parts=segments, cuts=st.lists(st.integers(0, 400), max_size=30))
def test_any_chunking_gives_the_same_pieces_and_never_leaks_a_tool_block_as_text(
    parts: list[tuple[str, str]], cuts: list[int]
) -> None:
    wrap = {"text": "{}", "thinking": "<thinking>{}</thinking>", "tool": "<tool>{}</tool>"}
    answer = "".join(wrap[kind].format(text) for kind, text in parts)

    pieces = parse(split_at(answer, cuts))

    assert joined(pieces, "text") == "".join(t for k, t in parts if k == "text")
    assert joined(pieces, "thinking") == "".join(t for k, t in parts if k == "thinking")
    assert [t for k, t in pieces if k == "tool"] == [t for k, t in parts if k == "tool"]
    for kind, text in pieces:
        if kind == "text":
            assert "<" not in text
            assert "tool_name" not in text


@given(answer=st.text(alphabet="<>/toolhink_ab{}", max_size=60), cuts=st.lists(st.integers(0, 60)))
def test_chunking_never_changes_what_the_parser_reads(answer: str, cuts: list[int]) -> None:
    whole = parse([answer])

    chunked = parse(split_at(answer, cuts))

    for kind in ("text", "thinking"):
        assert joined(chunked, kind) == joined(whole, kind)
    assert [p for p in chunked if p[0] in ("tool", "unclosed_tool")] == [
        p for p in whole if p[0] in ("tool", "unclosed_tool")
    ]


# -- tool blocks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ('{"tool_name": "ls", "arguments": {"path": "."}}', ("ls", '{"path": "."}', None)),
        ('{"name": "ls", "parameters": {"a": 1}}', ("ls", '{"a": 1}', None)),
        ('{"tool_name": "ls", "arguments": "{\\"a\\": 1}"}', ("ls", '{"a": 1}', None)),
        ('{"tool_name": "ls"}', ("ls", "{}", None)),
        ('```json\n{"tool_name": "ls", "arguments": {}}\n```', ("ls", "{}", None)),
        ('{"server_name": "local", "tool_name": "ls", "arguments": {}}', ("ls", "{}", None)),
    ],
)
def test_well_formed_tool_blocks_are_read(
    block: str, expected: tuple[str, str, str | None]
) -> None:
    assert parse_tool_block(block) == expected


def test_a_malformed_tool_block_keeps_its_text_and_recovers_the_name() -> None:
    name, arguments, problem = parse_tool_block('{"tool_name": "read_file", "arguments": {"pa')

    assert name == "read_file"
    assert arguments == '{"tool_name": "read_file", "arguments": {"pa'
    assert problem is not None
    assert problem.startswith("the <tool> block is not valid JSON")


@pytest.mark.parametrize(
    ("block", "problem"),
    [("[1, 2]", "must hold a JSON object"), ('{"arguments": {}}', 'no "tool_name"')],
)
def test_a_tool_block_without_a_call_is_marked_invalid(block: str, problem: str) -> None:
    name, _, found = parse_tool_block(block)

    assert name == ""
    assert found is not None
    assert problem in found


# -- prompt conversion ------------------------------------------------------------------------


def test_the_tools_prompt_lists_every_schema_and_the_calling_rules() -> None:
    prompt = render_tools_prompt([READ_FILE], tool_choice="required")

    assert '"tool_name": "NAME"' in prompt
    assert json.dumps(READ_FILE.parameters) in prompt
    assert "must call at least one tool" in prompt


def test_a_prompt_is_rewritten_for_a_model_without_tool_calling() -> None:
    messages = [
        ChatMessage(role="system", content="You are careful."),
        ChatMessage(role="user", content="Read a.py and b.py"),
        ChatMessage(
            role="assistant",
            content="Reading both.",
            tool_calls=(
                ToolCall(id="c1", name="read_file", arguments='{"path": "a.py"}'),
                ToolCall(id="c2", name="read_file", arguments='{"path": "b.py"'),
            ),
        ),
        ChatMessage(role="tool", content="A", tool_call_id="c1"),
        ChatMessage(role="tool", content="B", tool_call_id="c2", name="read_file"),
    ]

    converted = to_xml_messages(messages, [READ_FILE])

    assert [m.role for m in converted] == ["system", "user", "assistant", "user"]
    assert converted[0].content.startswith("You are careful.\n\n<tool_calling>")
    assert all(not m.tool_calls and m.tool_call_id is None for m in converted)
    assert converted[2].content == (
        "Reading both.\n"
        '<tool>\n{"tool_name": "read_file", "arguments": {"path": "a.py"}}\n</tool>\n'
        '<tool>\n{"tool_name": "read_file", "arguments": "{\\"path\\": \\"b.py\\""}\n</tool>'
    )
    assert converted[3].content == (
        '<tool_result tool_name="read_file" call_id="c1">\nA\n</tool_result>\n\n'
        '<tool_result tool_name="read_file" call_id="c2">\nB\n</tool_result>'
    )


def test_without_a_system_message_the_tools_prompt_becomes_one() -> None:
    converted = to_xml_messages([ChatMessage(role="user", content="hi")], [READ_FILE])

    assert converted[0].role == "system"
    assert "<available_tools>" in converted[0].content
    assert converted[1] == ChatMessage(role="user", content="hi")


def test_tool_choice_none_offers_no_tools() -> None:
    messages = [ChatMessage(role="system", content="S"), ChatMessage(role="user", content="hi")]

    assert to_xml_messages(messages, [READ_FILE], tool_choice="none") == messages


# -- end to end through the client ------------------------------------------------------------

XML_ANSWER = (
    "<thinking>The user wants a.py.</thinking>Let me read it.\n"
    '<tool>\n{"tool_name": "read_file", "arguments": {"path": "a.py"}}\n</tool>'
)


@pytest.fixture
async def client(openai_server: OpenAIServer) -> AsyncIterator[OpenAIClient]:
    llm = OpenAIClient("local", base_url=openai_server.base_url, api_key="k", tool_mode="xml")
    yield llm
    await llm.aclose()


REQUEST = LLMRequest(
    messages=[
        ChatMessage(role="system", content="Be useful."),
        ChatMessage(role="user", content="What is in a.py?"),
    ],
    tools=[READ_FILE],
)


def check_answer(completion: Completion) -> None:
    assert completion.text == "Let me read it."
    assert completion.thinking == "The user wants a.py."
    assert completion.finish_reason == "tool_calls"
    (tool_call,) = completion.tool_calls
    assert tool_call.name == "read_file"
    assert tool_call.parsed_arguments == {"path": "a.py"}
    assert tool_call.id.startswith("call_")


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 7])
async def test_a_streamed_xml_answer_yields_tool_calls_and_never_shows_the_xml(
    openai_server: OpenAIServer, client: OpenAIClient, chunk_size: int
) -> None:
    openai_server.script(sse_reply(text_chunks(XML_ANSWER, chunk_size=chunk_size)))

    events: list[StreamEvent] = [e async for e in client.stream(REQUEST)]

    text = [e.text for e in events if isinstance(e, TextChunk)]
    assert "".join(text) == "Let me read it.\n"
    assert not any("<" in t or "tool_name" in t or "thinking" in t for t in text)
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingChunk))
    assert thinking == "The user wants a.py."
    started = [e for e in events if isinstance(e, ToolCallChunk)]
    assert [(s.index, s.name) for s in started] == [(0, "read_file")]
    arguments = [e.delta for e in events if isinstance(e, ToolCallArgumentsChunk)]
    assert json.loads("".join(arguments)) == {"path": "a.py"}
    completion = events[-1]
    assert isinstance(completion, Completion)
    check_answer(completion)
    assert completion.tool_calls[0].id == started[0].id
    body = openai_server.requests[0].body
    assert "tools" not in body
    assert "<available_tools>" in body["messages"][0]["content"]
    assert body["messages"][0]["content"].startswith("Be useful.")


async def test_a_non_streamed_xml_answer_yields_the_same_completion(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(json_reply(completion_body(XML_ANSWER)))

    check_answer(await client.complete(REQUEST))


async def test_a_malformed_xml_tool_block_becomes_an_invalid_tool_call(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    answer = 'Trying.<tool>{"tool_name": "read_file", "arguments": {"path": }</tool>'
    openai_server.script(sse_reply(text_chunks(answer, chunk_size=4)))

    events = [e async for e in client.stream(REQUEST)]

    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.text == "Trying."
    (tool_call,) = completion.tool_calls
    assert tool_call.name == "read_file"
    assert tool_call.parsed_arguments is None
    assert tool_call.parse_error is not None
    assert "not valid JSON" in tool_call.parse_error
    assert tool_call.arguments == '{"tool_name": "read_file", "arguments": {"path": }'


async def test_an_xml_answer_cut_inside_a_tool_block_gives_an_invalid_call_not_text(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    answer = 'Reading.<tool>{"tool_name": "read_file", "argu'
    openai_server.script(sse_reply(text_chunks(answer, finish_reason="length")))

    completion = [e async for e in client.stream(REQUEST)][-1]

    assert isinstance(completion, Completion)
    assert completion.text == "Reading."
    assert completion.finish_reason == "length"
    (tool_call,) = completion.tool_calls
    assert tool_call.parse_error is not None
    assert "never closed" in tool_call.parse_error


async def test_earlier_calls_and_results_are_sent_back_as_text_the_model_can_read(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(json_reply(completion_body("a.py prints 1.")))
    request = LLMRequest(
        messages=[
            *REQUEST.messages,
            ChatMessage(
                role="assistant",
                tool_calls=(ToolCall(id="c1", name="read_file", arguments='{"path":"a.py"}'),),
            ),
            ChatMessage(role="tool", content="print(1)", tool_call_id="c1"),
        ],
        tools=[READ_FILE],
    )

    completion = await client.complete(request)

    assert completion.text == "a.py prints 1."
    assert completion.tool_calls == ()
    messages = openai_server.requests[0].body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"].startswith("<tool>")
    assert messages[3]["content"] == (
        '<tool_result tool_name="read_file" call_id="c1">\nprint(1)\n</tool_result>'
    )


async def test_a_tool_block_wrapped_in_a_code_fence_leaves_no_empty_fence_in_the_text(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    answer = 'Reading.\n```xml\n<tool>{"tool_name": "read_file", "arguments": {}}</tool>\n```\n'
    openai_server.script(json_reply(completion_body(answer)))

    completion = await client.complete(REQUEST)

    assert completion.text == "Reading."
    assert [c.name for c in completion.tool_calls] == ["read_file"]
