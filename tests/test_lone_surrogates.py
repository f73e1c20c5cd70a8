"""Lone surrogates from JSON escapes are mended where text enters a run (`agent_flow._unicode`).

A server that cuts a stream between the two halves of an emoji sends each half as its own
``\\ud83d`` escape; a tool that lists undecodable file names returns ``\\udcff``. No UTF-8
encoder takes either: before, the run died when its first event was written and its session
was never saved. Now a pair split across chunks is joined again, a lone half becomes U+FFFD,
and the run, its events and its stored session are whole. Driven through the real `openai`
SDK against a scripted server on a real socket, with a real SQLite store.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_flow import AgentConfig, AgentExecutor
from agent_flow._unicode import Mender, is_clean, mend
from agent_flow.events import TextDelta, ToolCallCompleted, event_to_json
from agent_flow.history import ExtractiveSummarizer, ToolCallEntry, UserMessage
from agent_flow.llm import LLMSummarizer, OpenAIClient
from agent_flow.messages import ToolCall
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.testing import FunctionLLM, reply
from agent_flow.tokens import ApproxCounter
from agent_flow.tools import ToolExecutor, tool
from tests.openai_server import OpenAIServer, completion_body, json_reply, sse_reply

EMOJI = "\U0001f600"
HIGH, LOW = "\ud83d", "\ude00"  # the emoji's two UTF-16 halves

_TEXT = st.lists(
    st.sampled_from([HIGH, LOW, "\udcff", "a", "é", EMOJI, " "]) | st.characters(),
    max_size=40,
).map("".join)


@given(text=_TEXT)
def test_mended_text_encodes_keeps_clean_text_and_joins_pairs(text: str) -> None:
    mended = mend(text)
    mended.encode()  # no UnicodeEncodeError
    assert is_clean(mended)
    assert mend(mended) == mended
    if is_clean(text):
        assert mended is text
    assert mend(text.replace(EMOJI, HIGH + LOW)) == mend(text)


@given(text=_TEXT, cuts=st.lists(st.integers(0, 40), max_size=8))
def test_a_text_mended_piece_by_piece_is_the_text_mended_whole(text: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    mender = Mender()
    passed = [mender.feed(piece) for piece in pieces]
    assert "".join(passed) + mender.flush() == mend(text)
    assert all(is_clean(piece) for piece in passed)


def _chunk(content: str, finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


async def _run(
    server: OpenAIServer,
    tmp_path: Path,
    *,
    stream: bool,
    tools: ToolExecutor | None = None,
    output_type: type[BaseModel] | None = None,
    tool_mode: Literal["native", "xml"] = "native",
) -> tuple[Any, list[Any], Any]:
    store = SQLiteSessionStore(tmp_path / "sessions.db")
    async with store:
        llm = OpenAIClient(
            "m", base_url=server.base_url, api_key="k", max_retries=0, tool_mode=tool_mode
        )
        agent = AgentExecutor(
            llm,
            stream=stream,
            store=store,
            tools=tools,
            config=AgentConfig(max_iterations=4),
            output_type=output_type,
        )
        try:
            async with agent.subscribe() as events:
                outcome = await agent.run("say it")
                seen = [event async for event in events]  # it ended with the run
        finally:
            await llm.aclose()
        assert agent.session_id is not None
        stored = await store.load(agent.session_id)
        stored_events = await store.events(agent.session_id)
        for event in stored_events:
            event_to_json(event).encode()
        return outcome, seen, (stored, stored_events)


def _open_file(received: list[str], answer: Callable[[str], str]) -> Any:
    """A tool ``open_file(path)`` that notes each path it gets and answers `answer(path)`."""

    @tool
    def open_file(path: str) -> str:
        """Open a file.

        Args:
            path: The file.
        """
        received.append(path)
        return answer(path)

    return open_file


async def test_an_emoji_split_across_two_chunks_is_joined_again(tmp_path: Path) -> None:
    async with OpenAIServer() as server:
        server.script(sse_reply([_chunk("ok " + HIGH), _chunk(LOW + " done", "stop")]))
        outcome, seen, (stored, _) = await _run(server, tmp_path, stream=True)
    assert outcome.final_text == f"ok {EMOJI} done"
    deltas = "".join(e.text for e in seen if isinstance(e, TextDelta))
    assert deltas == f"ok {EMOJI} done"
    assert stored.entries[-1].content == f"ok {EMOJI} done"


async def test_a_lone_half_at_the_end_of_a_stream_becomes_a_replacement_character(
    tmp_path: Path,
) -> None:
    async with OpenAIServer() as server:
        server.script(sse_reply([_chunk("ok "), _chunk(HIGH, "stop")]))
        outcome, seen, (stored, stored_events) = await _run(server, tmp_path, stream=True)
    assert outcome.final_text == "ok \ufffd"
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "ok \ufffd"
    assert stored.entries[-1].content == "ok \ufffd"
    assert stored_events[-1].kind == "run_finished"


async def test_a_whole_answer_with_a_lone_half_is_mended(tmp_path: Path) -> None:
    async with OpenAIServer() as server:
        server.script(json_reply(completion_body("ok " + LOW + " and " + HIGH + LOW)))
        outcome, _, (stored, _) = await _run(server, tmp_path, stream=False)
    assert outcome.final_text == f"ok \ufffd and {EMOJI}"
    assert stored.entries[-1].content == f"ok \ufffd and {EMOJI}"


async def test_escaped_halves_in_tool_arguments_and_results_are_mended(tmp_path: Path) -> None:
    undecodable = os.fsdecode(b"report-\xff.txt")  # 'report-\udcff.txt', as os.listdir gives
    received: list[str] = []
    open_file = _open_file(received, lambda path: f"{path} is next to {undecodable}")

    arguments = '{"path": "notes-\\ud83d.txt"}'  # an escaped lone half inside the JSON text
    async with OpenAIServer() as server:
        server.script(
            json_reply(completion_body(tool_calls=[("call_1", "open_file", arguments)])),
            json_reply(completion_body("done")),
        )
        outcome, seen, (stored, _) = await _run(
            server, tmp_path, stream=False, tools=ToolExecutor([open_file])
        )
    assert outcome.final_text == "done"
    assert received == ["notes-\ufffd.txt"]
    (completed,) = [e for e in seen if isinstance(e, ToolCallCompleted)]
    assert completed.content == "notes-\ufffd.txt is next to report-\ufffd.txt"
    assert any(
        getattr(entry, "content", None) == "notes-\ufffd.txt is next to report-\ufffd.txt"
        for entry in stored.entries
    )


class _Named(BaseModel):
    name: str


@pytest.mark.parametrize("stream", [False, True])
async def test_an_escaped_lone_half_in_a_structured_answer_is_mended(
    tmp_path: Path, stream: bool
) -> None:
    """The answer's text is clean (the escape is six ASCII characters); the JSON read from it
    held a lone surrogate, and the run ended in error with its output unwritable."""
    answer = '{"name": "x\\ud800 and \\ud83d\\ude00"}'
    async with OpenAIServer() as server:
        if stream:
            server.script(sse_reply([_chunk(answer, "stop")]))
        else:
            server.script(json_reply(completion_body(answer)))
        outcome, _, (_, stored_events) = await _run(
            server, tmp_path, stream=stream, output_type=_Named
        )
    assert outcome.stop_reason.value == "completed", outcome
    assert outcome.output == {"name": f"x\ufffd and {EMOJI}"}
    assert stored_events[-1].kind == "run_finished"


async def test_an_escaped_lone_half_in_an_xml_tool_block_is_mended(tmp_path: Path) -> None:
    received: list[str] = []
    open_file = _open_file(received, lambda path: "opened")

    block = '<tool>{"tool_name": "open_file", "arguments": {"path": "a-\\ud83d.txt"}}</tool>'
    async with OpenAIServer() as server:
        server.script(json_reply(completion_body(block)), json_reply(completion_body("done")))
        outcome, seen, _ = await _run(
            server, tmp_path, stream=False, tools=ToolExecutor([open_file]), tool_mode="xml"
        )
    assert outcome.final_text == "done"
    assert received == ["a-\ufffd.txt"]
    (completed,) = [e for e in seen if isinstance(e, ToolCallCompleted)]
    assert completed.content == "opened"


async def test_a_summary_with_a_lone_half_is_mended_before_it_joins_the_history() -> None:
    summarizer = LLMSummarizer(
        FunctionLLM(lambda request: reply("they asked for " + HIGH + LOW + " and " + LOW)),
        counter=ApproxCounter(),
    )
    summary = await summarizer.summarize([UserMessage(content="hello")], max_tokens=200)
    assert summary == f"they asked for {EMOJI} and \ufffd"


async def test_the_extractive_summary_of_escaped_halves_in_arguments_can_be_written() -> None:
    """The arguments text is clean ASCII; the JSON read from it held a lone surrogate, which
    the summary line then carried into the history (and the stored session)."""
    call = ToolCall(id="1", name="read", arguments='{"path": "a-\\udcff.txt", "\\ud800": 1}')
    summary = await ExtractiveSummarizer().summarize([ToolCallEntry(call=call)], max_tokens=200)
    summary.encode()  # raised UnicodeEncodeError before
    assert "a-\ufffd.txt" in summary
