"""Server-Sent Events: the session event stream as an HTTP response, with FastAPI's encoder.

A live event is written to the client's socket in the task that publishes it: the response is
the watcher's `push` (see `LiveSession.watch`), and its write is started right there
(`agent_flow._eager.start_eagerly`). Handing the event to the response's own task instead would
make it wait for that task's turn on the event loop, behind every other ready callback: with a
hundred busy sessions in one process that wait is tens to hundreds of milliseconds, while the
write itself takes microseconds. The events a run publishes in one step of its task (from one
wait to the next) go out in one write, when the step ends (`agent_flow.server._batching`):
one system call per step and client, where each event was one. Only when a write cannot
finish at once (the client reads slowly and the transport pauses) do later events queue,
under the watcher's back-pressure policy, and the response's task sends them in batches (one
write per batch) once that write is through; the stored events of a resumed stream come the
same way. An empty batch becomes a
keep-alive comment. Every watcher of a session writes the same bytes for an event: it is
encoded once.

No client can hold a run for long, whatever its policy: a ``wait`` watcher whose queue is full
makes the agent wait for room only until it has been behind for
`ServerSettings.watcher_max_wait` seconds (counted from when an event was last queued for it
with nothing else queued). Past that bound its oldest events are dropped, exactly as under
``drop_oldest``, and it gets one ``events_dropped`` event for the gap when it reads again; it is
waited for again once it has caught up. A client that never reads so costs the run one such
wait in all, and its stream stays open (it may still read, or disconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi.sse import KEEPALIVE_COMMENT
from starlette.responses import StreamingResponse
from starlette.types import Send

from agent_flow._eager import start_eagerly
from agent_flow.events import AgentEvent, BackpressurePolicy
from agent_flow.server._batching import current as current_batch
from agent_flow.server._live import LiveSession

__all__ = ["HELD_BYTES", "SSE_HEADERS", "EventStreamResponse"]

#: Most bytes of frames a batched step holds before it writes them: asyncio's transports pause
#: their writers (a client that reads slowly) once 64 KiB wait in their buffers.
HELD_BYTES = 64 * 1024

#: Headers of every event stream: no caching, and no buffering by an nginx in front.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStreamResponse(StreamingResponse):
    """One client's stream of a session's events (see the module doc).

    Starlette's `StreamingResponse` runs it and ends it when the client disconnects.
    """

    def __init__(
        self,
        live: LiveSession,
        after: int,
        *,
        policy: BackpressurePolicy,
        maxsize: int,
        follow: bool,
        idle: float | None,
        max_wait: float | None,
    ) -> None:
        super().__init__(_no_content(), media_type="text/event-stream", headers=SSE_HEADERS)
        self._live = live
        self._after = after
        self._policy: BackpressurePolicy = policy
        self._maxsize = maxsize
        self._follow = follow
        self._idle = idle
        self._max_wait = max_wait

    async def stream_response(self, send: Send) -> None:
        """Send the head, then the events as the watcher hands them over or pushes them."""
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        writer = _Writer(send)
        batches = self._live.watch(
            self._after,
            policy=self._policy,
            maxsize=self._maxsize,
            follow=self._follow,
            idle=self._idle,
            push=writer.push if self._follow else None,
            max_wait=self._max_wait,
        )
        try:
            # Closed here, not whenever it is collected: its subscription leaves the bus now.
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    await writer.write(_chunk(batch) if batch else KEEPALIVE_COMMENT)
            await writer.write(b"", more=False)
        finally:
            writer.abandon()


class _Writer:
    """Writes one response's chunks in order, from its own task or a publisher's."""

    def __init__(self, send: Send) -> None:
        self._send = send
        #: The response's task is writing: a pushed event must queue behind its chunk.
        self._busy = False
        #: A pushed write that could not finish at once (it goes on in a task).
        self._pending: asyncio.Future[None] | None = None
        self._failure: Exception | None = None
        #: Frames pushed in the running batched step (`agent_flow.server._batching`).
        self._held: list[bytes] = []
        self._held_bytes = 0

    def push(self, event_id: int | None, event: AgentEvent) -> bool:
        """Take `event` if nothing is being written (True), else decline it (False).

        A taken event is written now, or with the rest of its step in a batched step.
        """
        if self._busy or (self._pending is not None and not self._pending.done()):
            return False
        if self._failure is not None:
            return True  # the stream is broken; its task ends it at its next write
        frame = _frame(event_id, event)
        batch = current_batch()
        if batch is None:
            self._start(frame)
            return True
        if not self._held:
            batch.hold(self._flush)
        self._held.append(frame)
        self._held_bytes += len(frame)
        if self._held_bytes >= HELD_BYTES:
            # A step that publishes a lot writes as it goes: a write the client's connection
            # cannot take at once then declines the next events, which queue under the
            # watcher's policy, as they do without batches.
            self._flush()
        return True

    def _flush(self) -> None:
        """Write the frames held in the step so far, in one write."""
        held, self._held, self._held_bytes = self._held, [], 0
        if held and self._failure is None:
            self._start(b"".join(held))  # one frame: joined, it is that frame itself

    def _start(self, chunk: bytes) -> None:
        # Whatever a client's broken connection raises is kept (`_finished`), never raised
        # into the run that publishes.
        try:
            pending = start_eagerly(self._send(_body(chunk)))
        except asyncio.CancelledError as err:  # the response's send, not the run, cancelled
            self._failure = RuntimeError(f"the stream's write was cancelled: {err}")
            return
        if pending.done():
            self._finished(pending)
        else:
            self._pending = pending
            pending.add_done_callback(self._finished)

    def _finished(self, pending: asyncio.Future[None]) -> None:
        if not pending.cancelled() and pending.exception() is not None:
            error = pending.exception()
            self._failure = error if isinstance(error, Exception) else RuntimeError(str(error))

    async def write(self, chunk: bytes, *, more: bool = True) -> None:
        """Send `chunk` after any pushed write still under way."""
        self._busy = True
        try:
            pending, self._pending = self._pending, None
            if pending is not None and not pending.done():
                with contextlib.suppress(Exception):  # `_finished` keeps its failure
                    await pending
            if self._failure is not None:
                raise self._failure
            await self._send(_body(chunk, more=more))
        finally:
            self._busy = False

    def abandon(self) -> None:
        """Stop a pushed write still under way (the stream is over)."""
        self._held, self._held_bytes = [], 0
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()


class _FrameCache:
    """The frame of the event encoded last: every watcher of a session writes the same bytes.

    The bus hands one event to its watchers one after the other, so one entry is enough.
    """

    def __init__(self) -> None:
        # One tuple, replaced whole: a reader never sees one event's id with another's frame.
        self._entry: tuple[AgentEvent | None, int | None, bytes] = (None, None, b"")

    def frame(self, event_id: int | None, event: AgentEvent) -> bytes:
        entry = self._entry
        if entry[0] is event and entry[1] == event_id:
            return entry[2]
        encoded = _encode(event_id, event)
        self._entry = (event, event_id, encoded)
        return encoded


def _encode(event_id: int | None, event: AgentEvent) -> bytes:
    """The frame FastAPI's `format_sse_event` writes for the event, written directly.

    Compact JSON is one line (it escapes every CR and LF inside a string), so the event is
    one ``data:`` line and needs none of that function's line splitting: half the time, for
    every event every watcher gets (`tests/test_server_sse_frames.py` holds them equal).
    """
    data = type(event).__pydantic_serializer__.to_json(event)  # `model_dump_json`, as bytes
    if event_id is None:
        return b"event: %s\ndata: %s\n\n" % (event.kind.encode(), data)
    return b"event: %s\ndata: %s\nid: %d\n\n" % (event.kind.encode(), data, event_id)


_frame = _FrameCache().frame


def _chunk(batch: Sequence[tuple[int | None, AgentEvent]]) -> bytes:
    return b"".join(_frame(event_id, event) for event_id, event in batch)


def _body(chunk: bytes, *, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": chunk, "more_body": more}


async def _no_content() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that yields nothing (the response writes its own body)
