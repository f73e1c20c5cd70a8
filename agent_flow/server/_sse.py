"""Server-Sent Events framing of the session event stream, with FastAPI's own encoder.

`LiveSession.watch` hands over events in batches; each batch becomes ONE chunk of the
response, so the events a busy run publishes between two writes cost one socket write instead
of one each (the write is most of what streaming costs the server). An empty batch becomes a
keep-alive comment. FastAPI's generator-based SSE responses send every event on its own
through two memory streams and a timer; this keeps its encoder and framing and drops that.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from fastapi.sse import KEEPALIVE_COMMENT, format_sse_event

from agent_flow.events import AgentEvent

__all__ = ["SSE_HEADERS", "sse_frames"]

#: Headers of every event stream: no caching, and no buffering by an nginx in front.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def sse_frames(
    batches: AsyncIterator[Sequence[tuple[int | None, AgentEvent]]],
) -> AsyncIterator[bytes]:
    """One response chunk per batch: its events as SSE frames (``id:`` = the event's id)."""
    async for batch in batches:
        if not batch:
            yield KEEPALIVE_COMMENT
            continue
        yield b"".join(
            format_sse_event(
                data_str=event.model_dump_json(),
                event=event.kind,
                id=None if event_id is None else str(event_id),
            )
            for event_id, event in batch
        )
