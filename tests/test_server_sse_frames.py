"""The event stream's frames: written directly, byte for byte what FastAPI's encoder writes.

`agent_flow.server._sse` writes an event's frame itself (its JSON is one line, so it needs
none of `format_sse_event`'s line splitting). Whatever the event's text holds (line breaks of
every kind, the Unicode separators JSON leaves as they are, a field of only ``data:``), the
frame must be the one FastAPI writes, and an SSE reader must get the event back from it.
"""

from __future__ import annotations

from fastapi.sse import format_sse_event
from hypothesis import given
from hypothesis import strategies as st

from agent_flow.events import (
    AgentEvent,
    TextDelta,
    ToolCallCompleted,
    WarningRaised,
    event_from_json,
)
from agent_flow.server._sse import _encode

_TEXT = st.lists(
    st.sampled_from(["\n", "\r", "\r\n", "\u2028", "\u2029", "\x85", "data: ", ":", "\x00"])
    | st.characters(codec="utf-8")
).map("".join)
_PATH = st.lists(st.text(max_size=8), max_size=2).map(tuple)

_NUMBERED = {"run_id": st.text(max_size=8), "seq": st.integers(0, 10**6)}
_EVENTS = st.one_of(
    st.builds(TextDelta, text=_TEXT, **_NUMBERED),
    st.builds(WarningRaised, message=_TEXT, source=_TEXT, path=_PATH, **_NUMBERED),
    st.builds(
        ToolCallCompleted,
        call_id=_TEXT,
        name=_TEXT,
        content=_TEXT,
        duration_ms=st.floats(0, 10**6),
        **_NUMBERED,
    ),
)


def _read(frame: bytes) -> tuple[str | None, str, str | None]:
    """Parse one frame as an SSE client does: (event, data, id)."""
    assert frame.endswith(b"\n\n")
    kind = event_id = None
    data: list[str] = []
    for line in frame.decode().removesuffix("\n\n").split("\n"):
        field, _, value = line.partition(": ")
        if field == "event":
            kind = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value
    return kind, "\n".join(data), event_id


@given(event=_EVENTS, event_id=st.none() | st.integers(0, 2**63))
def test_a_frame_is_what_fastapi_writes_and_reads_back_as_the_event(
    event: AgentEvent, event_id: int | None
) -> None:
    frame = _encode(event_id, event)
    assert frame == format_sse_event(
        data_str=event.model_dump_json(),
        event=event.kind,
        id=None if event_id is None else str(event_id),
    )
    kind, data, read_id = _read(frame)
    assert kind == event.kind
    assert read_id == (None if event_id is None else str(event_id))
    assert event_from_json(data) == event
