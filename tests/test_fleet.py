"""A fleet: two `agent-flow serve` processes on one PostgreSQL session store.

Real processes: two servers (``--no-token``, ``--db postgresql://...?schema=...``, a fresh
schema per test) talk to the scripted OpenAI server over HTTP, and every agent they build
starts a real MCP server over stdio, marked by an environment variable so that the test can
find them in /proc. Clients watch every session on every server over SSE.

- One run per session across the fleet: a run in flight on one server makes the other answer
  409 ``run_in_progress`` naming it (the session's claim in the store), both ways, to a
  message and to a ``DELETE`` of the session; then the
  same message goes to the same session through both servers at once, round after round, and
  exactly one accepts (202). The model holds every run until all answers are in, so the
  accepted run is surely in flight when the other request arrives.
- A crash: a server is SIGKILLed while two of its runs stall mid-stream. One session is then
  messaged through the other server, the other through the server restarted on the same
  store: both take over at once (the dead holder was a process of this machine), and a client
  that watched the session on the other server all along gets the killed run's
  ``interrupted`` end before the next run's events. One more contended round goes through both.
- From the store, at the end: no session has two overlapping runs, no event id is reused
  (ids strictly increase; every id an SSE client saw names the same stored event, or was
  handed out by the killed server and lies below every later run's ids), every run ended
  exactly once (the killed ones ``interrupted``), and no server or MCP process is left after
  shutdown.

It prints runs/s and the p99 of POST -> 202 with one server and with two (``pytest -s``).

The second test sends one session's turns through both servers in turn: each server's agent
must go on from what the store holds (every turn in the prompt and in the stored history).
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from collections import Counter

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")
pytest.importorskip("psycopg", reason="the fleet tests need the 'postgres' extra")


from agent_flow.events import AgentEvent, RunFinished
from agent_flow.history import UserMessage
from agent_flow.sessions import open_store
from tests.fleet_harness import (
    ANSWER,
    MCP_MARK,
    SERVE_MARK,
    Fleet,
    Ledger,
    Model,
    Seen,
    Server,
    Watchers,
    exited,
    marked,
    refused_for,
    send,
)
from tests.openai_server import OpenAIServer, sse_reply, text_chunks

CONTENDED_SESSIONS = 4
CONTENDED_ROUNDS = 4
TIMED_SESSIONS = 4
TIMED_RUNS = 25
#: A streamed answer that stops after a few chunks and never ends: its run is in flight.
STALLED = sse_reply(text_chunks(" ".join(f"w{n}" for n in range(40)), chunk_size=4), stall_after=6)


# -- the scenes -------------------------------------------------------------------------------


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


async def _timed_runs(
    servers: list[Server], watchers: Watchers, ledger: Ledger
) -> tuple[float, float]:
    """Runs/s and the p99 of POST -> 202 in ms, `TIMED_SESSIONS` sessions at once.

    Session i always goes through server i mod len(servers), `TIMED_RUNS` runs one after the
    other, after an untimed run that builds its agent (and starts its MCP server).
    """
    sessions = []
    for index in range(TIMED_SESSIONS):
        server = servers[index % len(servers)]
        created = await server.http.post("/sessions", json={})
        assert created.status_code == 201, created.text
        sessions.append((server, created.json()["id"]))
        await watchers.open(server, created.json()["id"])
    latencies: list[float] = []

    async def drive(server: Server, sid: str, runs: int) -> None:
        for run in range(runs):
            started = time.perf_counter()
            answer = await send(server, sid, f"run {run}")
            latencies.append(time.perf_counter() - started)
            await watchers.finished(server, sid, ledger.accepted(sid, answer))

    await asyncio.gather(*(drive(server, sid, 1) for server, sid in sessions))
    latencies.clear()
    started = time.perf_counter()
    await asyncio.gather(*(drive(server, sid, TIMED_RUNS) for server, sid in sessions))
    elapsed = time.perf_counter() - started
    return len(latencies) / elapsed, _p99(latencies) * 1000


async def _blocked_round(
    servers: list[Server], sids: list[str], model: Model, watchers: Watchers, ledger: Ledger
) -> None:
    """A run in flight on one server: the other refuses the session's next message.

    Session i's run goes through server i mod 2: each server blocks the other at least once.
    """
    model.open.clear()

    async def block(index: int, sid: str) -> tuple[Server, str]:
        owner, other = servers[index % 2], servers[1 - index % 2]
        run_id = ledger.accepted(sid, await send(owner, sid, "first"))
        refused_for(await send(other, sid, "meanwhile"), run_id)
        # Nor is the session deleted from under the run (whose writes would then fail).
        refused_for(await other.http.delete(f"/sessions/{sid}"), run_id)
        # A cancel there cannot reach it: said so, naming it, not "no run".
        cancel = await other.http.post(f"/sessions/{sid}/cancel", json={})
        assert cancel.status_code == 409, cancel.text
        assert (cancel.json()["code"], cancel.json()["run_id"]) == ("not_running", run_id)
        assert "in another process" in cancel.json()["message"]
        return owner, run_id

    owners = await asyncio.gather(*(block(index, sid) for index, sid in enumerate(sids)))
    model.open.set()
    await asyncio.gather(
        *(
            watchers.finished(owner, sid, run_id)
            for sid, (owner, run_id) in zip(sids, owners, strict=True)
        )
    )


async def _contended_round(
    servers: list[Server],
    sids: list[str],
    message: str,
    model: Model,
    watchers: Watchers,
    ledger: Ledger,
) -> None:
    """Each session gets `message` through every server at once: one 202, the rest 409."""
    model.open.clear()  # every run waits in its model call until all answers are in

    async def contend(sid: str) -> tuple[Server, str]:
        answers = await asyncio.gather(*(send(server, sid, message) for server in servers))
        statuses = [answer.status_code for answer in answers]
        assert sorted(statuses) == [202] + [409] * (len(servers) - 1), [a.text for a in answers]
        winner = statuses.index(202)
        run_id = ledger.accepted(sid, answers[winner])
        for answer in answers[:winner] + answers[winner + 1 :]:
            refused_for(answer, run_id)
        return servers[winner], run_id

    winners = await asyncio.gather(*(contend(sid) for sid in sids))
    model.open.set()
    await asyncio.gather(
        *(
            watchers.finished(server, sid, run_id)
            for sid, (server, run_id) in zip(sids, winners, strict=True)
        )
    )


def _check_store(
    stored: dict[str, list[tuple[int, AgentEvent]]], seen: dict[str, list[Seen]], ledger: Ledger
) -> None:
    """The pass conditions of the module doc, from what the store holds and clients saw."""
    overlapping: list[str] = []
    reused: list[object] = []
    ended_wrong: list[object] = []
    for sid, events in stored.items():
        ids = [event_id for event_id, _ in events]
        if ids != sorted(set(ids)):
            reused.append((sid, "ids not strictly increasing"))
        # Runs never interleave: between a run's start and its end, only its own events (a
        # killed run may have stored nothing but the end the next claim gave it).
        current: str | None = None
        for _, event in events:
            if event.kind == "run_started":
                if current is not None and sid not in overlapping:
                    overlapping.append(sid)
                current = event.run_id
            elif event.kind == "run_finished":
                if current not in (None, event.run_id) and sid not in overlapping:
                    overlapping.append(sid)
                current = None
            elif current != event.run_id and sid not in overlapping:
                overlapping.append(sid)
        # Every run ended exactly once, in the order they were accepted; killed: interrupted.
        ends = [event for _, event in events if isinstance(event, RunFinished)]
        counts = Counter(end.run_id for end in ends)
        if [end.run_id for end in ends] != ledger.runs[sid] or set(counts.values()) != {1}:
            ended_wrong.append((sid, [end.run_id for end in ends], ledger.runs[sid]))
        killed = ledger.killed.get(sid)
        for end in ends:
            if (end.stop_reason == "interrupted") != (end.run_id == killed):
                ended_wrong.append((sid, end.run_id, end.stop_reason))
        # Every id a client saw names the same stored event, or is one the killed server
        # handed out before its step was saved, below every id of the runs after it.
        by_id = dict(events)
        after_kill = ledger.runs[sid][ledger.runs[sid].index(killed) + 1 :] if killed else []
        later = min((i for i, event in events if event.run_id in after_kill), default=None)
        for frame in seen.get(sid, []):
            event = by_id.get(frame.id)
            if event is not None:
                if (event.kind, event.run_id, event.seq) != (frame.kind, frame.run_id, frame.seq):
                    reused.append((sid, frame, event))
            elif frame.run_id != killed or later is None or frame.id >= later:
                reused.append((sid, frame, "never stored"))
    assert overlapping == [], f"sessions with overlapping runs: {overlapping}"
    assert reused == [], f"reused event ids: {reused}"
    assert ended_wrong == [], f"runs not ended exactly once as expected: {ended_wrong}"


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_two_servers_one_store_one_run_per_session_ids_never_reused_nothing_leaked(
    fleet: Fleet, openai_server: OpenAIServer, store_url: str
) -> None:
    model = Model(openai_server)
    ledger = Ledger()
    watchers = Watchers()
    async with asyncio.timeout(200), watchers.stack:
        a = await fleet.start()
        b = await fleet.start()

        one = await _timed_runs([a], watchers, ledger)
        two = await _timed_runs([a, b], watchers, ledger)
        print(
            f"\nfleet, {TIMED_SESSIONS} sessions x {TIMED_RUNS} runs, one session's runs one "
            f"after another: 1 server {one[0]:.1f} runs/s, POST->202 p99 {one[1]:.1f} ms; "
            f"2 servers {two[0]:.1f} runs/s, POST->202 p99 {two[1]:.1f} ms"
        )

        sids = []
        for index in range(CONTENDED_SESSIONS):
            created = await (a, b)[index % 2].http.post("/sessions", json={})
            assert created.status_code == 201, created.text
            sids.append(created.json()["id"])
            for server in (a, b):
                await watchers.open(server, sids[-1])
        await _blocked_round([a, b], sids, model, watchers, ledger)
        for round_ in range(CONTENDED_ROUNDS):
            await _contended_round([a, b], sids, f"round {round_}", model, watchers, ledger)

        # Two runs of server A stall mid-stream, their first text already out; A is killed.
        doomed = sids[:2]
        for sid in doomed:
            openai_server.script(STALLED)
            ledger.killed[sid] = ledger.accepted(sid, await send(a, sid, "doomed"))
            await watchers.until(a, sid, "text_delta", ledger.killed[sid])
        await fleet.kill(a)
        watchers.forget(a)
        killed_port = a.port

        # The other server takes the first session over at once; its watcher, open all along,
        # learns that the killed run ended before the next one starts (after the runs of A it
        # had not been sent yet: they come, from the store, when its own next run starts).
        run_id = ledger.accepted(doomed[0], await send(b, doomed[0], "after the crash"))
        ends = [
            (seen.run_id, seen.stop_reason)
            for seen in await watchers.finished(b, doomed[0], run_id)
            if seen.kind == "run_finished"
        ]
        assert ends[-2:] == [(ledger.killed[doomed[0]], "interrupted"), (run_id, "answered")]
        assert {stop for _, stop in ends[:-2]} <= {"answered"}, ends
        # and a server restarted on the store the second one.
        a = await fleet.start()
        for sid in sids:
            await watchers.open(a, sid)
        run_id = ledger.accepted(doomed[1], await send(a, doomed[1], "after the restart"))
        await watchers.finished(a, doomed[1], run_id)
        await _contended_round([a, b], sids, "last round", model, watchers, ledger)

        # Shutdown: both servers stop, and take their agents' MCP servers with them.
        mcp_servers = marked(MCP_MARK, fleet.marker)
        assert mcp_servers, "every agent built has an MCP server running"
        await watchers.stack.aclose()
        for server in (a, b):
            # uvicorn raises the SIGTERM it handled again once it has shut down.
            assert await fleet.stop(server) in (0, -signal.SIGTERM), server.output()
        assert await exited(mcp_servers, 15) == [], "MCP servers left after shutdown"
        assert marked(MCP_MARK, fleet.marker) == []
        assert marked(SERVE_MARK, fleet.marker) == []

    async with open_store(store_url) as store:
        stored = {sid: await store.events_with_ids(sid) for sid in ledger.runs}
    _check_store(stored, watchers.seen, ledger)
    # No gap in any stream of a server that lived: what it gave is a stretch of the store.
    for (sid, port), ids in watchers.ids.items():
        if port != killed_port and ids:
            every = [event_id for event_id, _ in stored[sid]]
            first = every.index(ids[0])
            assert ids == every[first : first + len(ids)], (sid, port)


@pytest.mark.timeout(120)
async def test_turns_sent_through_both_servers_are_all_kept_and_all_in_the_prompt(
    fleet: Fleet, openai_server: OpenAIServer, store_url: str
) -> None:
    """A server's agent must go on from what the other server stored, not from its own copy."""
    openai_server.handler = lambda request: ANSWER
    watchers = Watchers()
    async with asyncio.timeout(100), watchers.stack:
        a, b, sid = await fleet.two_watching_one_session(watchers)
        for server, message in ((a, "one"), (b, "two"), (a, "three")):
            answer = await send(server, sid, message)
            assert answer.status_code == 202, answer.text
            await watchers.finished(server, sid, answer.json()["run_id"])
    async with open_store(store_url) as store:
        state = await store.load(sid)
    turns = ("one", "two", "three")
    last_prompt = openai_server.bodies[-1]["messages"]
    asked = [m["content"] for m in last_prompt if m["role"] == "user" and m["content"] in turns]
    kept = [entry.content for entry in state.entries if isinstance(entry, UserMessage)]
    # The third turn, on A, is asked with the second one (run on B) in its prompt, and the
    # stored history keeps all three.
    assert {"prompt": asked, "stored": kept} == {"prompt": list(turns), "stored": list(turns)}


@pytest.mark.timeout(120)
async def test_a_killed_servers_run_is_over_for_the_other_server_at_once(
    fleet: Fleet, openai_server: OpenAIServer
) -> None:
    """Cancel, answer and delete through the other server after a kill: no dead run named.

    Server A is SIGKILLed mid-run; its claim would stand until it expires (30 s). Server B,
    asked at once to cancel the session's run, must not answer "its run runs in another
    process, cancel it there": it ends the dead run (its watcher gets the ``interrupted``
    end) and says there is no run to cancel; the same for an approval's answer; and the
    session can be deleted through B at once.
    """
    openai_server.handler = lambda request: ANSWER
    watchers = Watchers()
    async with asyncio.timeout(100), watchers.stack:
        a, b, sid = await fleet.two_watching_one_session(watchers)
        openai_server.script(STALLED)
        answer = await send(a, sid, "doomed")
        assert answer.status_code == 202, answer.text
        doomed = answer.json()["run_id"]
        await watchers.until(a, sid, "text_delta", doomed)
        await fleet.kill(a)
        watchers.forget(a)

        started = time.perf_counter()
        cancel = await b.http.post(f"/sessions/{sid}/cancel", json={})
        assert cancel.status_code == 409, cancel.text
        body = cancel.json()
        assert (body["code"], body["run_id"]) == ("not_running", None), body
        assert "another process" not in body["message"], body
        ends = [s for s in await watchers.finished(b, sid, doomed) if s.kind == "run_finished"]
        assert [(s.run_id, s.stop_reason) for s in ends][-1:] == [(doomed, "interrupted")]

        approval = await b.http.post(f"/sessions/{sid}/approvals/call-1", json={"approved": True})
        assert approval.status_code == 409, approval.text
        assert (approval.json()["code"], approval.json()["run_id"]) == ("not_waiting", None)
        deleted = await b.http.delete(f"/sessions/{sid}")
        assert deleted.status_code == 204, deleted.text
        # All of it well inside the dead claim's 30 s.
        assert time.perf_counter() - started < 10
        assert (await b.http.get(f"/sessions/{sid}")).status_code == 404


@pytest.mark.timeout(120)
async def test_an_agent_resumed_during_the_other_servers_run_goes_on_from_its_end(
    fleet: Fleet, openai_server: OpenAIServer, store_url: str
) -> None:
    """`POST /resume` on B while A's run holds the session builds B's agent mid-run: B's
    next message must start from the store (A's whole run), not from that copy."""
    model = Model(openai_server)
    openai_server.record = True
    watchers = Watchers()
    async with asyncio.timeout(100), watchers.stack:
        a, b, sid = await fleet.two_watching_one_session(watchers)
        model.open.clear()  # A's run waits for its model
        first = await send(a, sid, "one")
        assert first.status_code == 202, first.text
        resumed = await b.http.post(f"/sessions/{sid}/resume", json={})
        assert resumed.status_code == 200, resumed.text
        model.open.set()
        await watchers.finished(a, sid, first.json()["run_id"])
        second = await send(b, sid, "two")
        assert second.status_code == 202, second.text
        await watchers.finished(b, sid, second.json()["run_id"])
    last_prompt = openai_server.bodies[-1]["messages"]
    asked = [m["content"] for m in last_prompt if m["role"] == "user"]
    async with open_store(store_url) as store:
        state = await store.load(sid)
    kept = [entry.content for entry in state.entries if isinstance(entry, UserMessage)]
    assert {"prompt": asked, "stored": kept} == {"prompt": ["one", "two"], "stored": ["one", "two"]}
