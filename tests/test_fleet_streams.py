"""Event streams across a fleet: whichever server a client reads, it gets every run's events.

Two real `agent-flow serve` processes on one PostgreSQL store take turns running one session.
A server's replay (``?follow=false``, ``Last-Event-ID``, ``after``) gives everything stored after
the id, the runs of the other server included: before, it read the store only below its own
latest run, so the runs another server made after it were missing, and a resume after its own
run gave nothing. A stream left open on one server gets the other server's runs when its own
next run starts (they are stored by then; they are not sent live), so the ids it gives stay one
sequence with no gap. Its view of the session (``GET /sessions/{id}``) is the store's too.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")
pytest.importorskip("psycopg", reason="the fleet tests need the 'postgres' extra")

from agent_flow.sessions import open_store
from tests.fleet_harness import ANSWER, Fleet, Server, Watchers, send
from tests.openai_server import OpenAIServer
from tests.server_harness import stream


async def _replay(server: Server, sid: str, after: int | None = None) -> list[int]:
    """The ids of `sid`'s events that `server` replays after `after` (Last-Event-ID)."""
    headers = None if after is None else {"Last-Event-ID": str(after)}
    path = f"/sessions/{sid}/events"
    async with stream(server.http, path, headers=headers, follow="false") as events:
        return [int(frame.id) for frame in await events.rest() if frame.id is not None]


@pytest.mark.timeout(120)
async def test_every_server_streams_and_replays_the_runs_of_the_other(
    fleet: Fleet, openai_server: OpenAIServer, store_url: str
) -> None:
    openai_server.handler = lambda request: ANSWER
    watchers = Watchers()
    async with asyncio.timeout(100), watchers.stack:
        a, b, sid = await fleet.two_watching_one_session(watchers)
        runs: list[str] = []
        for server, message in ((a, "one"), (b, "two"), (a, "three"), (b, "four")):
            answer = await send(server, sid, message)
            assert answer.status_code == 202, answer.text
            runs.append(answer.json()["run_id"])
            await watchers.finished(server, sid, runs[-1])
        async with open_store(store_url) as store:
            stored = [event_id for event_id, _ in await store.events_with_ids(sid, after_id=-1)]
            entries = len((await store.load(sid)).entries)
        # Either server's view is the store's, though A's agent is behind it (B ran last).
        for server in (a, b):
            view = (await server.http.get(f"/sessions/{sid}")).json()
            assert view["history"]["entries"] == entries, server.port
    assert stored == sorted(set(stored))
    ends = {
        run: stored.index(seen.id)
        for seen in watchers.seen[sid]
        for run in runs
        if seen.kind == "run_finished" and seen.run_id == run
    }
    assert list(ends) == runs
    # Replays, on either server, from the start or from any run's end: all that is stored.
    async with asyncio.timeout(60):
        for server in (a, b):
            assert await _replay(server, sid) == stored, server.port
            for end in ends.values():
                assert await _replay(server, sid, stored[end]) == stored[end + 1 :]
    # A's open stream gave B's run "two" before its own "three" (and nothing of "four", which
    # is not sent live to another server); B's gave A's "one" and "three" before its own.
    assert watchers.ids[sid, a.port] == stored[: ends[runs[2]] + 1]
    assert watchers.ids[sid, b.port] == stored
