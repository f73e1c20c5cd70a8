"""A fleet: two `agent-flow serve` processes on one PostgreSQL session store.

Real processes: two servers (``--no-token``, ``--db postgresql://...?schema=...``, a fresh
schema per test) talk to the scripted OpenAI server over HTTP, and every agent they build
starts a real MCP server over stdio, marked by an environment variable so that the test can
find them in /proc. Clients watch every session on every server over SSE.

- One run per session across the fleet: a run in flight on one server makes the other answer
  409 ``run_in_progress`` naming it (the session's claim in the store), both ways; then the
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
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")
pytest.importorskip("psycopg", reason="the fleet tests need the 'postgres' extra")

import httpx2

from agent_flow.events import AgentEvent, RunFinished
from agent_flow.history import UserMessage
from agent_flow.sessions import open_store
from tests.openai_server import OpenAIServer, RecordedRequest, Reply, sse_reply, text_chunks
from tests.server_harness import EventStream, free_port, serve_command, stream
from tests.store_helpers.postgres import URL, drop_schema, require_postgres

ROOT = Path(__file__).resolve().parent.parent
BASIC_MCP = ROOT / "tests" / "mcp_servers" / "basic_server.py"
JSON = {"Content-Type": "application/json"}
#: Environment variables marking this test's MCP servers and `agent-flow serve` processes.
MCP_MARK, SERVE_MARK = "AF_FLEET_MCP", "AF_FLEET_SERVE"

CONTENDED_SESSIONS = 4
CONTENDED_ROUNDS = 4
TIMED_SESSIONS = 4
TIMED_RUNS = 25
ANSWER = sse_reply(text_chunks("fine"))
#: A streamed answer that stops after a few chunks and never ends: its run is in flight.
STALLED = sse_reply(text_chunks(" ".join(f"w{n}" for n in range(40)), chunk_size=4), stall_after=6)


# -- processes -----------------------------------------------------------------------------


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited: only its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _marked(name: str, marker: str) -> list[int]:
    """The running processes whose environment holds ``name=marker``."""
    needle = f"{name}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and _running(int(entry.name)):
            found.append(int(entry.name))
    return found


async def _exited(pids: list[int], seconds: float) -> list[int]:
    """Wait at most `seconds` for every process of `pids` to exit; those still running.

    Not our children, so nothing to `wait` for: a pidfd turns readable when its process exits.
    """
    loop = asyncio.get_running_loop()
    fds: list[int] = []
    waits: list[asyncio.Future[None]] = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        done: asyncio.Future[None] = loop.create_future()

        def gone(fd: int = fd, done: asyncio.Future[None] = done) -> None:
            loop.remove_reader(fd)  # it stays readable: once is enough
            done.set_result(None)

        loop.add_reader(fd, gone)
        fds.append(fd)
        waits.append(done)
    try:
        if waits:
            await asyncio.wait(waits, timeout=seconds)
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)
    return [pid for pid in pids if _running(pid)]


def _spawn(
    config: Path, store_url: str, log: Path, marker: str
) -> tuple[subprocess.Popen[bytes], int]:
    """Start `agent-flow serve` on a free port; its stderr goes to `log`."""
    port = free_port()
    with log.open("wb") as errors:
        process = subprocess.Popen(
            serve_command(str(config), store_url, port),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env={**os.environ, "FLEET_TEST_KEY": "sk-fleet", SERVE_MARK: marker},
        )
    return process, port


@dataclass
class Server:
    """One `agent-flow serve` process and a client of it."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    http: httpx2.AsyncClient

    def output(self) -> str:
        return self.log.read_text()


@dataclass
class Fleet:
    """The servers of one test on one store; every one is stopped at the end."""

    config: Path
    store_url: str
    folder: Path
    marker: str
    started: list[Server] = field(default_factory=list)

    async def start(self) -> Server:
        """A new server on the store, once it answers."""
        log = self.folder / f"serve-{len(self.started)}.log"
        process, port = _spawn(self.config, self.store_url, log, self.marker)
        http = httpx2.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            timeout=30,
            headers=JSON,
            limits=httpx2.Limits(max_connections=100, max_keepalive_connections=100),
        )
        server = Server(process, port, log, http)
        self.started.append(server)
        for _ in range(800):
            if process.poll() is not None:
                raise AssertionError(f"serve exited at start: {server.output()}")
            try:
                await http.get("/sessions")
                return server
            except httpx2.ConnectError:
                await asyncio.sleep(0.025)  # a subprocess has no event to say it listens
        raise AssertionError(f"no server answered on port {port}: {server.output()}")

    async def kill(self, server: Server) -> None:
        server.process.send_signal(signal.SIGKILL)
        # Reaped: a dead process that is still a zombie looks alive to the next claimant.
        await asyncio.to_thread(server.process.wait, 30)
        await server.http.aclose()

    async def stop(self, server: Server) -> int:
        """Stop `server` as an operator does (SIGTERM); its exit status."""
        server.process.terminate()
        try:
            return await asyncio.to_thread(server.process.wait, 30)
        finally:
            await server.http.aclose()

    def kill_all(self) -> None:
        for server in self.started:
            if server.process.poll() is None:
                server.process.kill()
            server.process.wait(30)


# -- the model and the clients ---------------------------------------------------------------


class Model:
    """The scripted model's answer to every unscripted request, held while `open` is clear."""

    def __init__(self, server: OpenAIServer) -> None:
        self.open = asyncio.Event()
        self.open.set()
        server.handler = self.answer
        server.record = False

    async def answer(self, request: RecordedRequest) -> Reply:
        await self.open.wait()
        return ANSWER


@dataclass(frozen=True)
class Seen:
    """One event as an SSE client read it."""

    id: int
    kind: str
    run_id: str
    seq: int
    stop_reason: str | None = None


@dataclass
class Watchers:
    """One event stream per (session, server), open until `stack` closes; all they read."""

    streams: dict[tuple[str, int], EventStream] = field(default_factory=dict)
    seen: dict[str, list[Seen]] = field(default_factory=dict)
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    async def open(self, server: Server, sid: str) -> None:
        path = f"/sessions/{sid}/events"
        self.streams[sid, server.port] = await self.stack.enter_async_context(
            stream(server.http, path)
        )

    def forget(self, server: Server) -> None:
        """Stop reading `server`'s streams (it was killed)."""
        for key in [key for key in self.streams if key[1] == server.port]:
            del self.streams[key]

    async def until(self, server: Server, sid: str, kind: str, run_id: str) -> list[Seen]:
        """Read `sid`'s stream on `server` up to the first `kind` event of the run `run_id`."""
        events = self.streams[sid, server.port]
        got = []
        while True:
            frame = await events.next()
            assert frame.id is not None and frame.event is not None, frame
            data = frame.json
            got.append(
                Seen(
                    int(frame.id), frame.event, data["run_id"], data["seq"], data.get("stop_reason")
                )
            )
            self.seen.setdefault(sid, []).append(got[-1])
            if frame.event == kind and data["run_id"] == run_id:
                return got

    async def finished(self, server: Server, sid: str, run_id: str) -> list[Seen]:
        return await self.until(server, sid, "run_finished", run_id)


@dataclass
class Ledger:
    """Every run the servers accepted, by session in order, and the runs that were killed."""

    runs: dict[str, list[str]] = field(default_factory=dict)
    killed: dict[str, str] = field(default_factory=dict)

    def accepted(self, sid: str, answer: httpx2.Response) -> str:
        assert answer.status_code == 202, answer.text
        run_id: str = answer.json()["run_id"]
        self.runs.setdefault(sid, []).append(run_id)
        return run_id


def _refused_for(answer: httpx2.Response, run_id: str) -> None:
    """`answer` is the 409 that names the run in flight."""
    assert answer.status_code == 409, answer.text
    body = answer.json()
    assert (body["code"], body["run_id"]) == ("run_in_progress", run_id), body


async def _send(server: Server, sid: str, message: str) -> httpx2.Response:
    return await server.http.post(f"/sessions/{sid}/messages", json={"message": message})


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
            answer = await _send(server, sid, f"run {run}")
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
        run_id = ledger.accepted(sid, await _send(owner, sid, "first"))
        _refused_for(await _send(other, sid, "meanwhile"), run_id)
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
        answers = await asyncio.gather(*(_send(server, sid, message) for server in servers))
        statuses = [answer.status_code for answer in answers]
        assert sorted(statuses) == [202] + [409] * (len(servers) - 1), [a.text for a in answers]
        winner = statuses.index(202)
        run_id = ledger.accepted(sid, answers[winner])
        for answer in answers[:winner] + answers[winner + 1 :]:
            _refused_for(answer, run_id)
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


# -- the fixtures ----------------------------------------------------------------------------


@pytest.fixture
def store_url() -> Iterator[str]:
    """A session store URL on a fresh PostgreSQL schema, dropped after the test."""
    require_postgres()
    schema = f"af_fleet_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{URL}?schema={schema}"
    finally:
        drop_schema(schema)


@pytest.fixture
async def fleet(
    tmp_path: Path, store_url: str, openai_server: OpenAIServer
) -> AsyncIterator[Fleet]:
    """Servers on `store_url`, their agents on the scripted model with an MCP server each."""
    marker = uuid.uuid4().hex
    config = tmp_path / "agent.toml"
    config.write_text(
        "[agent]\nname = 'fleet'\n"
        "[agent.llm]\n"
        f"model = 'm'\nbase_url = '{openai_server.base_url}'\napi_key_env = 'FLEET_TEST_KEY'\n"
        "[agent.context]\ncounter = 'approx'\n"
        "[[agent.mcp_servers]]\nkind = 'stdio'\nname = 'basic'\n"
        f"command = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(BASIC_MCP))}]\n"
        f"env = {{ {MCP_MARK} = '{marker}' }}\n"
    )
    # The schema is made here, once, rather than by two servers opening the store at once.
    async with open_store(store_url):
        pass
    group = Fleet(config, store_url, tmp_path, marker)
    try:
        yield group
    finally:
        group.kill_all()
        for server in group.started:
            await server.http.aclose()
        for pid in _marked(MCP_MARK, marker):  # what a failed test left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


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
            ledger.killed[sid] = ledger.accepted(sid, await _send(a, sid, "doomed"))
            await watchers.until(a, sid, "text_delta", ledger.killed[sid])
        await fleet.kill(a)
        watchers.forget(a)

        # The other server takes the first session over at once; its watcher, open all along,
        # learns that the killed run ended before the next one starts.
        run_id = ledger.accepted(doomed[0], await _send(b, doomed[0], "after the crash"))
        ends = [
            (seen.run_id, seen.stop_reason)
            for seen in await watchers.finished(b, doomed[0], run_id)
            if seen.kind == "run_finished"
        ]
        assert ends == [(ledger.killed[doomed[0]], "interrupted"), (run_id, "answered")], ends
        # and a server restarted on the store the second one.
        a = await fleet.start()
        for sid in sids:
            await watchers.open(a, sid)
        run_id = ledger.accepted(doomed[1], await _send(a, doomed[1], "after the restart"))
        await watchers.finished(a, doomed[1], run_id)
        await _contended_round([a, b], sids, "last round", model, watchers, ledger)

        # Shutdown: both servers stop, and take their agents' MCP servers with them.
        mcp_servers = _marked(MCP_MARK, fleet.marker)
        assert mcp_servers, "every agent built has an MCP server running"
        await watchers.stack.aclose()
        for server in (a, b):
            # uvicorn raises the SIGTERM it handled again once it has shut down.
            assert await fleet.stop(server) in (0, -signal.SIGTERM), server.output()
        assert await _exited(mcp_servers, 15) == [], "MCP servers left after shutdown"
        assert _marked(MCP_MARK, fleet.marker) == []
        assert _marked(SERVE_MARK, fleet.marker) == []

    async with open_store(store_url) as store:
        stored = {sid: await store.events_with_ids(sid) for sid in ledger.runs}
    _check_store(stored, watchers.seen, ledger)


@pytest.mark.timeout(120)
async def test_turns_sent_through_both_servers_are_all_kept_and_all_in_the_prompt(
    fleet: Fleet, openai_server: OpenAIServer, store_url: str
) -> None:
    """A server's agent must go on from what the other server stored, not from its own copy."""
    openai_server.handler = lambda request: ANSWER
    watchers = Watchers()
    async with asyncio.timeout(100), watchers.stack:
        a = await fleet.start()
        b = await fleet.start()
        created = await a.http.post("/sessions", json={})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        for server in (a, b):
            await watchers.open(server, sid)
        for server, message in ((a, "one"), (b, "two"), (a, "three")):
            answer = await _send(server, sid, message)
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
