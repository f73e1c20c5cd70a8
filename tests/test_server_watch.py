"""`LiveSession.watch`: batched and pushed delivery keep every watcher's ids contiguous and unique.

A watcher may join at any point of a run, resume after any id, and read while the run keeps
publishing; whatever the interleaving, it sees each id after its resume point exactly once, in
order, and no batch is larger than `BATCH`. With a `push` that takes some live events in the
publisher's task and declines others (a write still under way), the two ways together still
deliver one gap-free sequence. `start_eagerly` runs a write in the caller's task when it can
finish at once and hands the rest to a task when it cannot.

Over real HTTP, a client that asks for ``policy=wait`` (or ``POST /agui``, which waits) and then
never reads holds a long run for at most `ServerSettings.watcher_max_wait`: the run finishes,
and the stalled client, should it read after all, is told what it missed (``events_dropped``).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow._eager import start_eagerly
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import TextDelta
from agent_flow.server import ServerSettings, create_app
from agent_flow.server._live import BATCH, LiveSession
from agent_flow.server.models import SessionOptions
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import ToolExecutor, tool
from tests.server_harness import serving, stream


async def _live() -> LiveSession:
    store = InMemorySessionStore()
    await store.create(session_id="s")
    return LiveSession(id="s", options=SessionOptions(), store=store, approval_timeout=1.0)


async def _publish(live: LiveSession, seq: int) -> None:
    event = TextDelta(run_id="r", seq=seq, text=f"t{seq}")
    live.remember(event)
    await live.bus.publish(event)


async def _publish_all(live: LiveSession, seqs: range, pauses: list[bool]) -> None:
    """Publish `seqs`, yielding to the reader after each one whose place in `pauses` is set."""
    for seq in seqs:
        await _publish(live, seq)
        if pauses[seq % len(pauses)]:
            await asyncio.sleep(0)


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(min_value=1, max_value=2 * BATCH + 40),
    joined=st.data(),
    pauses=st.lists(st.booleans(), min_size=1, max_size=50),
)
def test_a_watcher_joining_anywhere_sees_each_later_id_once_in_order(
    total: int, joined: st.DataObject, pauses: list[bool]
) -> None:
    published_before = joined.draw(st.integers(min_value=0, max_value=total), label="joined at")
    after = joined.draw(st.integers(min_value=-1, max_value=published_before), label="after")

    async def scenario() -> tuple[list[int], list[int]]:
        live = await _live()
        live.bases["r"] = 0
        for seq in range(published_before):
            await _publish(live, seq)
        ids: list[int] = []
        sizes: list[int] = []

        async def read() -> None:
            async for batch in live.watch(after, policy="wait", maxsize=10_000, idle=5.0):
                sizes.append(len(batch))
                ids.extend(event_id for event_id, _ in batch if event_id is not None)
                if ids and ids[-1] == total - 1:
                    return

        reader = asyncio.create_task(read())
        await asyncio.sleep(0)
        await _publish_all(live, range(published_before, total), pauses)
        if after < total - 1:
            await asyncio.wait_for(reader, 5)
        else:
            reader.cancel()
        return ids, sizes

    ids, sizes = asyncio.run(scenario())
    assert ids == list(range(after + 1, total))
    assert all(0 < size <= BATCH for size in sizes)


def test_an_idle_watcher_gets_an_empty_batch_as_its_keep_alive_cue() -> None:
    async def scenario() -> list[int]:
        live = await _live()
        sizes: list[int] = []
        async for batch in live.watch(-1, policy="wait", maxsize=10, idle=0.01):
            sizes.append(len(batch))
            if len(sizes) == 2:
                break
        return sizes

    assert asyncio.run(scenario()) == [0, 0]


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(min_value=1, max_value=BATCH + 40),
    joined=st.data(),
    takes=st.lists(st.booleans(), min_size=1, max_size=50),
    pauses=st.lists(st.booleans(), min_size=1, max_size=50),
)
def test_pushed_and_batched_events_form_one_sequence_without_gap_or_duplicate(
    total: int, joined: st.DataObject, takes: list[bool], pauses: list[bool]
) -> None:
    published_before = joined.draw(st.integers(min_value=0, max_value=total), label="joined at")
    after = joined.draw(st.integers(min_value=-1, max_value=published_before), label="after")

    async def scenario() -> tuple[list[int], int]:
        live = await _live()
        live.bases["r"] = 0
        for seq in range(published_before):
            await _publish(live, seq)
        received: list[int] = []  # in the order the client would read them, either way
        complete = asyncio.Event()
        offers = 0
        reading = False  # the watcher's reader is sending a batch: pushes must wait

        def push(event_id: int | None, event: object) -> bool:
            nonlocal offers
            assert event_id is not None
            take = not reading and takes[offers % len(takes)]
            offers += 1
            if take:
                received.append(event_id)
                if event_id == total - 1:
                    complete.set()
            return take

        async def read() -> None:
            nonlocal reading
            async for batch in live.watch(
                after, policy="wait", maxsize=10_000, idle=5.0, push=push
            ):
                reading = True
                received.extend(event_id for event_id, _ in batch if event_id is not None)
                await asyncio.sleep(0)  # the write of the batch takes a turn of the loop
                reading = False
                if received and received[-1] == total - 1:
                    complete.set()

        reader = asyncio.create_task(read())
        await asyncio.sleep(0)
        await _publish_all(live, range(published_before, total), pauses)
        if after < total - 1:
            await asyncio.wait_for(complete.wait(), 5)
        reader.cancel()
        return received, offers

    received, _ = asyncio.run(scenario())
    assert received == list(range(after + 1, total))


def test_an_eager_write_that_need_not_wait_is_done_before_start_eagerly_returns() -> None:
    async def scenario() -> tuple[object, list[str]]:
        log: list[str] = []

        async def write() -> None:
            log.append("written")

        started = start_eagerly(write())
        log.append("returned")
        return started, log

    started, log = asyncio.run(scenario())
    assert isinstance(started, asyncio.Future) and started.done()
    assert log == ["written", "returned"]


def test_an_eager_write_that_waits_goes_on_in_a_task_and_can_be_cancelled() -> None:
    async def scenario() -> list[str]:
        log: list[str] = []
        room, never = asyncio.Event(), asyncio.Event()

        async def write(name: str, drained: asyncio.Event) -> None:
            log.append(f"{name} started")
            try:
                await drained.wait()  # a transport paused for flow control
                await asyncio.sleep(0)
                log.append(f"{name} written")
            except asyncio.CancelledError:
                log.append(f"{name} cancelled")
                raise

        first = start_eagerly(write("first", room))
        second = start_eagerly(write("second", never))
        assert not first.done() and not second.done()
        log.append("returned")
        room.set()
        await first
        second.cancel()  # reaches the wait the write stopped at
        with pytest.raises(asyncio.CancelledError):
            await second
        return log

    assert asyncio.run(scenario()) == [
        "first started",
        "second started",
        "returned",
        "first written",
        "second cancelled",
    ]


STEPS = 40


@tool
def echo(text: str) -> str:
    """Say it back, four times.

    Args:
        text: What to say.
    """
    return text * 4


def _echo_tools(config: AgentConfig) -> ToolExecutor:
    executor = ToolExecutor()
    executor.register(echo)
    return executor


def _busy_app(store: InMemorySessionStore) -> FastAPI:
    """A service whose one session's run takes `STEPS` steps of many events each."""
    words = " ".join(f"word{n}" for n in range(60))
    model = ScriptedLLM(
        [
            # Distinct arguments each step: the loop warns about (and ends) repeated calls.
            reply(words, tool_calls=[call("echo", text=f"{step}:" + "x" * 200)])
            for step in range(STEPS - 1)
        ]
        + [reply("done")]
    )
    return create_app(
        AgentConfig(context=ContextConfig(counter="approx"), max_iterations=STEPS + 5),
        store=store,
        # A queue of 8 fills at once behind a stalled socket; the bound is short to keep the
        # test quick (it is waited out once per stalled client).
        settings=ServerSettings(watcher_queue=8, watcher_max_wait=0.1),
        llm_factory=lambda config: model,
        tools_factory=_echo_tools,
    )


async def _never_reading(client: httpx2.AsyncClient, head: str, body: bytes = b"") -> socket.socket:
    """Send a request on a socket with a tiny receive window, and read nothing of the answer.

    `head` is the request line and any headers but ``Host``, without the final line break.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    url = client.base_url
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (url.host, url.port))
    await loop.sock_sendall(sock, f"{head}\r\nHost: {url.host}\r\n\r\n".encode() + body)
    return sock


async def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    """What the stalled client finally reads, up to the end of the frame that holds `marker`
    (chunk framing left in: a frame may span chunks)."""
    received = b""
    while marker not in received or b"\n\n" not in received[received.index(marker) :]:
        chunk = await asyncio.get_running_loop().sock_recv(sock, 65536)
        assert chunk, f"the stream ended before {marker!r}"
        received += chunk
    return received


async def _run_finished(client: httpx2.AsyncClient, store: InMemorySessionStore, sid: str) -> None:
    """Wait (on a reading stream) for the session's run to finish; check that it completed."""
    async with stream(client, f"/sessions/{sid}/events") as reading:
        await reading.until("run_finished")
    events = await store.events(sid)
    assert events[-1].kind == "run_finished"
    assert sum(event.kind == "iteration_started" for event in events) == STEPS


async def test_a_wait_watcher_that_never_reads_does_not_hold_up_the_run() -> None:
    store = InMemorySessionStore()
    async with serving(_busy_app(store), send_buffer=4096) as client:
        created = await client.post("/sessions", json={})
        sid = created.json()["id"]
        stalled = await _never_reading(client, f"GET /sessions/{sid}/events?policy=wait HTTP/1.1")
        try:
            sent = await client.post(f"/sessions/{sid}/messages", json={"message": "go"})
            assert sent.status_code == 202, sent.text
            await _run_finished(client, store, sid)
            body = (await _read_until(stalled, b"event: run_finished")).decode()
        finally:
            stalled.close()
    kinds = re.findall(r"^event: (\w+)\r?$", body, flags=re.MULTILINE)
    ids = [int(found) for found in re.findall(r"^id: (\d+)\r?$", body, flags=re.MULTILINE)]
    assert "events_dropped" in kinds and kinds[-1] == "run_finished"
    stored = await store.events_with_ids(sid)
    assert ids == sorted(set(ids)) and ids[-1] == stored[-1][0]


async def test_an_agui_client_that_never_reads_does_not_hold_up_the_run() -> None:
    store = InMemorySessionStore()
    async with serving(_busy_app(store), send_buffer=4096) as client:
        created = await client.post("/sessions", json={"session_id": "thread-1"})
        assert created.status_code == 201, created.text
        run_input = {
            "threadId": "thread-1",
            "runId": "run-1",
            "state": {},
            "messages": [{"id": "m1", "role": "user", "content": "go"}],
            "tools": [],
            "context": [],
            "forwardedProps": {},
        }
        payload = json.dumps(run_input).encode()
        stalled = await _never_reading(
            client,
            "POST /agui HTTP/1.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}",
            payload,
        )
        try:
            await _run_finished(client, store, "thread-1")
            body = (await _read_until(stalled, b'"type":"RUN_FINISHED"')).decode()
        finally:
            stalled.close()
    assert '"name":"events_dropped"' in body


def test_the_event_streams_default_policy_keeps_lifecycle_events() -> None:
    """`drop_deltas_first` is the SSE default (documented): a watcher that falls behind loses
    deltas before any lifecycle event (the bus's own tests check the policy itself)."""
    from agent_flow.server import create_app
    from agent_flow.sessions import InMemorySessionStore

    app = create_app(AgentConfig(), store=InMemorySessionStore())
    operation = app.openapi()["paths"]["/sessions/{session_id}/events"]["get"]
    (policy,) = [p for p in operation["parameters"] if p["name"] == "policy"]
    assert policy["schema"]["default"] == "drop_deltas_first"
    assert set(policy["schema"]["enum"]) == {"wait", "drop_oldest", "drop_deltas_first"}
