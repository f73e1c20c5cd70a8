"""`SSEChunks`: a stream's chunks read from its server-sent events, as the SDK reads them.

The SDK's own decoder (`openai._streaming.SSEDecoder`) is the oracle: for any events, with
any line endings, comments and multi-line data, cut into network reads anywhere, the
chunks are the data the SDK's iteration yields, up to ``[DONE]``. Then the errors, the
drain after ``[DONE]``, and the reason it exists: a streamed answer over the real SDK and
HTTP leaves no async generator for asyncio to finalize.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from agent_flow.llm import Completion, OpenAIClient
from agent_flow.llm._openai_sse import DRAIN_SECONDS, SSEChunks
from tests.openai_client_helpers import HELLO, collect, texts
from tests.openai_server import OpenAIServer, sse_reply, text_chunks

_REQUEST = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def _response(reads: list[bytes], *, then_wait: bool = False) -> httpx2.Response:
    async def body() -> AsyncIterator[bytes]:
        for read in reads:
            yield read
        if then_wait:
            await asyncio.sleep(3600)  # a server that keeps the stream open

    return httpx2.Response(200, content=body(), request=_REQUEST)


async def _chunks(reads: list[bytes], **options: Any) -> list[object]:
    response = _response(reads, **options)
    try:
        return [chunk async for chunk in SSEChunks(response)]
    finally:
        await response.aclose()


def _sdk_chunks(body: bytes) -> list[object]:
    """What the SDK's iteration of an `AsyncStream[object]` yields for `body`.

    Less a leading byte-order mark: the standard strips it, and so does `SSEChunks`; the
    SDK's decoder reads it as part of the first field's name (and loses that line).
    """
    chunks: list[object] = []
    for sse in SSEDecoder().iter_bytes(iter([body.removeprefix(b"\xef\xbb\xbf")])):
        if sse.data.startswith("[DONE]"):
            break
        chunks.append(sse.json())
    return chunks


def _cut(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(body)) for cut in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),  # any character: UTF-8
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
).filter(lambda value: not (isinstance(value, dict) and value.get("error")))


@st.composite
def _streams(draw: st.DrawFn) -> bytes:
    """Events as servers write them: JSON data (sometimes over several ``data`` lines),
    comments, event names and ids, any line ending, maybe a BOM, maybe ``[DONE]``."""
    end = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    parts = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    for value in draw(st.lists(_JSON, max_size=6)):
        text = json.dumps(value, indent=draw(st.sampled_from([None, 1])), ensure_ascii=False)
        if draw(st.booleans()):
            parts.append(b": keep-alive" + end)
        if draw(st.booleans()):
            parts.append(b"event: chunk" + end + b"id: 7" + end)
        space = draw(st.sampled_from([b" ", b""]))
        for line in text.split("\n"):
            parts.append(b"data:" + space + line.encode() + end)
        parts.append(end)
    if draw(st.booleans()):
        parts.append(b"data: [DONE]" + end + end)
        if draw(st.booleans()):
            parts.append(b'data: {"after": "done"}' + end + end)
    if draw(st.booleans()):
        parts.append(b'data: {"unfinished": true}' + end)  # the body ends inside an event
    return b"".join(parts)


@settings(max_examples=300, deadline=None)
@given(body=_streams(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
async def test_the_chunks_are_the_sdks_however_the_reads_are_cut(
    body: bytes, cuts: list[int]
) -> None:
    assert await _chunks(_cut(body, cuts)) == _sdk_chunks(body)


async def test_an_error_event_is_the_sdks_api_error_after_the_chunks_before_it() -> None:
    body = (
        b'data: {"n": 1}\n\n'
        b'data: {"error": {"message": "overloaded", "code": 503}}\n\n'
        b'data: {"n": 2}\n\n'
    )
    reader = SSEChunks(_response([body]))
    assert not reader.buffered  # nothing read yet
    assert await anext(reader) == {"n": 1}
    assert reader.buffered  # the error came in the same read: no wait for it
    with pytest.raises(openai.APIError) as caught:
        reader.next_buffered()
    assert type(caught.value) is openai.APIError  # what refused_in_stream recognizes
    assert caught.value.message == "overloaded"
    assert caught.value.body == {"message": "overloaded", "code": 503}


async def test_an_error_without_a_message_gets_the_sdks_sentence() -> None:
    with pytest.raises(openai.APIError, match="An error occurred during streaming"):
        await _chunks([b'data: {"error": "boom"}\n\n'])


@pytest.mark.parametrize(
    ("read", "error"),
    [(b"data: {not json\n\n", json.JSONDecodeError), (b"data: \xff\xfe\n\n", UnicodeDecodeError)],
)
async def test_data_that_is_not_json_or_not_utf8_raises_the_decoders_error(
    read: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        await _chunks([b'data: {"n": 1}\n\n', read])


async def test_after_done_the_rest_of_the_body_is_drained_for_a_while_at_most() -> None:
    response = _response([b'data: {"n": 1}\n\ndata: [DONE]\n\n'], then_wait=True)
    reader = SSEChunks(response)
    assert [chunk async for chunk in reader] == [{"n": 1}]  # [DONE] ends the iteration
    loop = asyncio.get_running_loop()
    start = loop.time()
    await reader.finish()  # the server keeps the stream open
    assert DRAIN_SECONDS <= loop.time() - start < DRAIN_SECONDS + 1
    assert response.is_closed


async def test_after_done_a_body_that_ends_is_read_to_its_end() -> None:
    response = _response([b'data: {"n": 1}\n\ndata: [DONE]\n\n', b": bye\n\n"])
    reader = SSEChunks(response)
    assert [chunk async for chunk in reader] == [{"n": 1}]
    await reader.finish()
    assert response.is_stream_consumed and response.is_closed


async def test_over_http2_the_stream_is_closed_at_done_without_a_drain() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"n": 1}\n\ndata: [DONE]\n\n'
        await asyncio.sleep(3600)

    response = httpx2.Response(
        200, content=body(), request=_REQUEST, extensions={"http_version": b"HTTP/2"}
    )
    reader = SSEChunks(response)
    assert [chunk async for chunk in reader] == [{"n": 1}]
    await asyncio.wait_for(reader.finish(), DRAIN_SECONDS / 2)
    assert response.is_closed


async def test_an_event_without_data_is_not_dispatched() -> None:
    """The standard's rule; the SDK's decoder would parse the empty data as JSON and fail."""
    assert await _chunks([b"event: ping\n\n: comment \xff\n\nid: 3\n\ndata: 1\n\n"]) == [1]


async def test_a_read_timeout_is_the_sdks_timeout_error() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"n": 1}\n\n'
        raise httpx2.ReadTimeout("no bytes in time")

    reader = SSEChunks(httpx2.Response(200, content=body(), request=_REQUEST))
    assert await anext(reader) == {"n": 1}
    with pytest.raises(openai.APITimeoutError):
        await anext(reader)


async def test_a_finished_answer_whose_server_keeps_the_stream_open_is_not_an_error() -> None:
    """Over the real SDK: the drain after [DONE] is outside the chunk and request deadlines."""
    whole = sse_reply(text_chunks("all done"))
    assert whole.events is not None
    # Every frame, [DONE] included, then silence: the body never ends.
    stalled = dataclasses.replace(whole, stall_after=len(whole.events), _encoded=b"")
    async with OpenAIServer() as server:
        server.script(stalled)
        llm = OpenAIClient(
            "m", base_url=server.base_url, api_key="k", chunk_timeout=0.05, max_retries=0
        )
        try:
            events = await collect(llm.stream(HELLO))
        finally:
            await llm.aclose()
    assert texts(events) == "all done"
    assert isinstance(events[-1], Completion)


async def test_a_lost_connection_is_the_sdks_connection_error() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"n": 1}\n\n'
        raise httpx2.RemoteProtocolError("peer closed connection")

    response = httpx2.Response(200, content=body(), request=_REQUEST)
    reader = SSEChunks(response)
    assert await anext(reader) == {"n": 1}
    with pytest.raises(openai.APIConnectionError):
        await anext(reader)


async def test_a_streamed_answer_leaves_no_async_generator_to_finalize() -> None:
    """asyncio finalizes a suspended async generator with a self-pipe wake-up and a task."""
    finalized: list[str] = []
    hooks = sys.get_asyncgen_hooks()

    def finalizer(agen: Any) -> None:
        finalized.append(agen.ag_code.co_qualname)
        assert hooks.finalizer is not None
        hooks.finalizer(agen)

    async with OpenAIServer() as server:
        server.script(*(sse_reply(text_chunks(f"answer {n}")) for n in range(3)))
        llm = OpenAIClient("m", base_url=server.base_url, api_key="k")
        try:
            await collect(llm.stream(HELLO))  # the first: connection set-up
            sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
            try:
                answers = [texts(await collect(llm.stream(HELLO))) for _ in range(2)]
            finally:
                sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=hooks.finalizer)
        finally:
            await llm.aclose()
    assert answers == ["answer 1", "answer 2"]
    assert finalized == []
