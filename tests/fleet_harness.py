"""A fleet of real `agent-flow serve` processes on one PostgreSQL session store, for tests.

`Fleet` starts servers (``--no-token``, ``--db postgresql://...?schema=...``, a fresh schema per
test: the `store_url` fixture) that talk to the scripted OpenAI server over HTTP; every agent
they build starts a real MCP server over stdio, marked by an environment variable so that a
test can find them in /proc. `Watchers` keeps one SSE stream per (session, server) and what it
read. Its fixtures `fleet` and `store_url` are a plugin of the tests' conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest

from agent_flow.sessions import open_store
from tests.openai_server import OpenAIServer, RecordedRequest, Reply, sse_reply, text_chunks
from tests.server_harness import EventStream, free_port, marked, running, serve_command, stream
from tests.store_helpers.postgres import URL, drop_schema, require_postgres

__all__ = [
    "ANSWER",
    "MCP_MARK",
    "SERVE_MARK",
    "Fleet",
    "Ledger",
    "Model",
    "Seen",
    "Server",
    "Watchers",
    "exited",
    "fleet",
    "marked",
    "refused_for",
    "running",
    "send",
    "store_url",
]

ROOT = Path(__file__).resolve().parent.parent
BASIC_MCP = ROOT / "tests" / "mcp_servers" / "basic_server.py"
JSON = {"Content-Type": "application/json"}
#: Environment variables marking this test's MCP servers and `agent-flow serve` processes.
MCP_MARK, SERVE_MARK = "AF_FLEET_MCP", "AF_FLEET_SERVE"

ANSWER = sse_reply(text_chunks("fine"))

# -- processes -----------------------------------------------------------------------------


async def exited(pids: list[int], seconds: float) -> list[int]:
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
    return [pid for pid in pids if running(pid)]


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

    async def two_watching_one_session(self, watchers: Watchers) -> tuple[Server, Server, str]:
        """Two new servers, a session made on the first, and a stream of it open on each."""
        a = await self.start()
        b = await self.start()
        created = await a.http.post("/sessions", json={})
        assert created.status_code == 201, created.text
        sid: str = created.json()["id"]
        for server in (a, b):
            await watchers.open(server, sid)
        return a, b, sid

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
    #: The ids each stream gave, by (session, server port), in order.
    ids: dict[tuple[str, int], list[int]] = field(default_factory=dict)
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
            self.ids.setdefault((sid, server.port), []).append(got[-1].id)
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


def refused_for(answer: httpx2.Response, run_id: str) -> None:
    """`answer` is the 409 that names the run in flight."""
    assert answer.status_code == 409, answer.text
    body = answer.json()
    assert (body["code"], body["run_id"]) == ("run_in_progress", run_id), body


async def send(server: Server, sid: str, message: str) -> httpx2.Response:
    return await server.http.post(f"/sessions/{sid}/messages", json={"message": message})


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
        for pid in marked(MCP_MARK, marker):  # what a failed test left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
