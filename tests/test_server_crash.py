"""A server killed mid-run: the run ends as ``interrupted``, and no event id is handed out twice.

Real processes: `agent-flow serve` (SQLite store) talks to the scripted OpenAI server over
HTTP; the test watches over SSE, SIGKILLs the server in the middle of a streamed answer, starts
a new one on the same store and sends the next message.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2

from agent_flow.sessions import SQLiteSessionStore, event_id
from tests.openai_server import OpenAIServer, sse_reply, text_chunks
from tests.server_harness import free_port, serve_command, stream


@contextmanager
def _serve(config: Path, db: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    env = {**os.environ, "CRASH_TEST_KEY": "sk-crash-test"}
    process = subprocess.Popen(
        serve_command(str(config), str(db), port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert process.stderr is not None
        process.stderr.readline()  # "serving": printed just before uvicorn binds
        yield process, f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


async def _client(base: str) -> httpx2.AsyncClient:
    client = httpx2.AsyncClient(
        base_url=base, timeout=30, headers={"Content-Type": "application/json"}
    )
    for _ in range(400):
        try:
            await client.get("/sessions")
            return client
        except httpx2.ConnectError:
            await asyncio.sleep(0.025)  # the server binds right after its banner
    raise AssertionError(f"no server answered at {base}")


async def test_a_killed_servers_run_ends_interrupted_and_its_ids_are_never_reused(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        "[agent]\nname = 'crash'\n[agent.llm]\n"
        f"model = 'm'\nbase_url = '{openai_server.base_url}'\napi_key_env = 'CRASH_TEST_KEY'\n"
        "[agent.context]\ncounter = 'approx'\n"
    )
    db = tmp_path / "s.db"
    words = " ".join(f"w{n}" for n in range(40))
    # The first answer streams a few chunks, then the server is killed while it stalls.
    openai_server.script(sse_reply(text_chunks(words, chunk_size=4), stall_after=6))
    with _serve(config, db) as (process, base):
        client = await _client(base)
        sid = (await client.post("/sessions", json={})).json()["id"]
        async with stream(client, f"/sessions/{sid}/events") as events:
            sent = await client.post(f"/sessions/{sid}/messages", json={"message": "talk"})
            assert sent.status_code == 202, sent.text
            first_run = sent.json()["run_id"]
            seen = await events.until("text_delta")
            seen += [await events.next() for _ in range(2)]
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        await client.aclose()
    seen_ids = [int(frame.id) for frame in seen if frame.id is not None]
    assert seen_ids == [event_id(1, n) for n in range(len(seen_ids))]
    # The store kept fewer events than the client saw: live events go out before their save.
    async with SQLiteSessionStore(db) as store:
        stored_before = await store.events_with_ids(sid)
    assert len(stored_before) < len(seen_ids)

    openai_server.script(sse_reply(text_chunks("second answer")))
    with _serve(config, db) as (_, base):
        client = await _client(base)
        # Resumed from the last id seen: the interrupted end, then the next run, nothing else.
        async with stream(
            client, f"/sessions/{sid}/events", headers={"Last-Event-ID": str(seen_ids[-1])}
        ) as events:
            sent = await client.post(f"/sessions/{sid}/messages", json={"message": "again"})
            assert sent.status_code == 202, sent.text
            second_run = sent.json()["run_id"]
            # Above every id the killed server handed out (reading the session ended the
            # dead run under a claim of its own: the next run's fence is the one after).
            assert sent.json()["first_event_id"] > seen_ids[-1]
            interrupted = await events.until("run_finished")
            finished = await events.until("run_finished")
        view = (await client.get(f"/sessions/{sid}")).json()
        await client.aclose()
    (ended,) = interrupted
    assert ended.json["run_id"] == first_run and ended.json["stop_reason"] == "interrupted"
    assert int(ended.id or -1) > seen_ids[-1]
    assert finished[-1].json["run_id"] == second_run
    assert finished[-1].json["final_text"] == "second answer"
    after = [int(frame.id) for frame in [*interrupted, *finished] if frame.id is not None]
    assert after == sorted(set(after)) and after[0] > seen_ids[-1]
    assert not set(after) & set(seen_ids)
    assert view["status"] == "completed"
    async with SQLiteSessionStore(db) as store:
        stored = await store.events_with_ids(sid)
    ids = [event_id_ for event_id_, _ in stored]
    assert ids == sorted(set(ids))
    ends = [e.run_id for _, e in stored if e.kind == "run_finished"]
    assert ends == [first_run, second_run]  # every run ended exactly once
