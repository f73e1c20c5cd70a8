"""One owner per live session: a hypothesis state machine over the real HTTP routes.

A real uvicorn (in a thread) serves sessions whose agents each start a real MCP server over
stdio. The machine creates, messages, resumes, cancels, deletes and evicts sessions, one
request at a time and two at once on the same session (the races that leaked agents and MCP
subprocesses, or answered 500). After every step: no answer is a 5xx, every live agent is
one running MCP subprocess and no more, and a deleted session is gone. At shutdown: none left.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
import uvicorn
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.history import UserMessage
from agent_flow.server import ServerSettings, create_app
from agent_flow.server._errors import ApiError
from agent_flow.server._manager import SessionManager
from agent_flow.server.models import CreateSession
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import FunctionLLM, reply
from tests.helpers import stdio_server
from tests.openai_server import OpenAIServer, sse_reply, text_chunks
from tests.server_harness import marked, serving, stream

JSON = {"Content-Type": "application/json"}


def _manager(store: Any) -> SessionManager:
    """A manager (no HTTP) whose sessions' model answers "hi"."""
    return SessionManager(
        AgentConfig(context=ContextConfig(counter="approx")),
        store,
        ServerSettings(),
        llm_factory=lambda config: FunctionLLM(lambda request: reply("hi")),
    )


class _Server:
    """The app on a real uvicorn in a thread, with the manager at hand."""

    def __init__(self, marker: str, *, max_live: int) -> None:
        server = stdio_server("basic", "basic_server.py", env={"AF_OWNERSHIP_MARKER": marker})
        config = AgentConfig(context=ContextConfig(counter="approx"), mcp_servers=[server])
        self.app = create_app(
            config,
            store=InMemorySessionStore(),
            settings=ServerSettings(max_live_sessions=max_live),
            llm_factory=lambda config: FunctionLLM(lambda request: reply("done")),
        )
        self.manager: SessionManager = self.app.state.manager
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.sock = sock
        self.base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(self.server.serve(sockets=[sock])),
            daemon=True,
        )
        self.thread.start()
        self.client = httpx2.Client(base_url=self.base, timeout=60, headers=JSON)

    def live_agents(self) -> int:
        return sum(1 for live in list(self.manager._live.values()) if live.agent is not None)

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()
        self.loop.close()


_Request = tuple[str, str, dict[str, str] | None]


async def _both(base: str, first: _Request, second: _Request) -> list[int]:
    async with httpx2.AsyncClient(base_url=base, timeout=60, headers=JSON) as client:
        answers = await asyncio.gather(
            *(client.request(method, path, json=body) for method, path, body in (first, second))
        )
    return [answer.status_code for answer in answers]


_OPS = {
    "message": ("POST", "/sessions/{}/messages", {"message": "go"}),
    "resume": ("POST", "/sessions/{}/resume", None),
    "delete": ("DELETE", "/sessions/{}", None),
    "cancel": ("POST", "/sessions/{}/cancel", None),
    "read": ("GET", "/sessions/{}", None),
}


class Ownership(RuleBasedStateMachine):
    """See the module doc."""

    sessions = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        self.marker = uuid.uuid4().hex
        self.server = _Server(self.marker, max_live=3)
        self.deleted: set[str] = set()
        self.statuses: list[int] = []

    @rule(target=sessions)
    def create(self) -> str:
        answer = self.server.client.post("/sessions", json={})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    @rule(session=sessions, op=st.sampled_from(sorted(_OPS)))
    def one(self, session: str, op: str) -> None:
        method, path, body = _OPS[op]
        answer = self.server.client.request(method, path.format(session), json=body)
        self.statuses.append(answer.status_code)
        if op == "delete" and answer.status_code == 204:
            self.deleted.add(session)
        if op in ("message", "resume") and answer.status_code in (200, 202):
            # The agent is built for real: its MCP server runs (the invariants count them).
            assert self.server.live_agents() >= 1

    @rule(
        session=consumes(sessions),
        ops=st.tuples(st.sampled_from(sorted(_OPS)), st.sampled_from(sorted(_OPS))),
    )
    def race(self, session: str, ops: tuple[str, str]) -> None:
        first, second = ((m, p.format(session), b) for m, p, b in (_OPS[ops[0]], _OPS[ops[1]]))
        statuses = asyncio.run(_both(self.server.base, first, second))
        self.statuses += statuses
        for op, status in zip(ops, statuses, strict=True):
            if op == "delete" and status == 204:
                self.deleted.add(session)

    @rule()
    def evict_everything_idle(self) -> None:
        evicting = self.server.manager.evict(now=float("inf"))
        asyncio.run_coroutine_threadsafe(evicting, self.server.loop).result(timeout=60)

    @invariant()
    def nothing_answers_5xx(self) -> None:
        assert all(status < 500 for status in self.statuses), self.statuses

    @invariant()
    def each_live_agent_is_one_mcp_subprocess(self) -> None:
        runs = [live for live in self.server.manager._live.values() if live.running]
        if runs:
            return  # a run in flight may be between building and closing; checked when idle
        assert len(marked("AF_OWNERSHIP_MARKER", self.marker)) == self.server.live_agents()

    @invariant()
    def deleted_sessions_are_gone(self) -> None:
        for session in self.deleted:
            assert self.server.client.get(f"/sessions/{session}").status_code == 404

    def teardown(self) -> None:
        self.server.close()
        assert marked("AF_OWNERSHIP_MARKER", self.marker) == []


def test_every_change_to_a_live_session_has_one_owner() -> None:
    run_state_machine_as_test(
        Ownership,
        settings=settings(
            max_examples=8,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


# -- eviction and shared clients --------------------------------------------------------------


async def test_idle_sessions_beyond_the_limit_are_evicted_least_recent_first_and_come_back() -> (
    None
):
    marker = uuid.uuid4().hex
    server = stdio_server("basic", "basic_server.py", env={"AF_OWNERSHIP_MARKER": marker})
    config = AgentConfig(context=ContextConfig(counter="approx"), mcp_servers=[server])
    app = create_app(
        config,
        store=InMemorySessionStore(),
        settings=ServerSettings(max_live_sessions=2),
        llm_factory=lambda config: FunctionLLM(lambda request: reply("done")),
    )
    manager: SessionManager = app.state.manager
    async with serving(app) as client:
        ids = []
        for _ in range(3):
            sid = (await client.post("/sessions", json={})).json()["id"]
            async with stream(client, f"/sessions/{sid}/events") as events:
                await client.post(f"/sessions/{sid}/messages", json={"message": "go"})
                await events.until("run_finished")
            ids.append(sid)
        assert len(marked("AF_OWNERSHIP_MARKER", marker)) == 3
        evicted = await manager.evict()
        assert evicted == [ids[0]]  # the least recently used, beyond the two kept
        assert manager.loaded(ids[0]) is None
        assert len(marked("AF_OWNERSHIP_MARKER", marker)) == 2
        # Unused for longer than idle_seconds: all go.
        assert sorted(await manager.evict(now=float("inf"))) == sorted(ids[1:])
        assert marked("AF_OWNERSHIP_MARKER", marker) == []
        # A later message rebuilds the session from the store, its history whole.
        async with stream(client, f"/sessions/{ids[0]}/events", after=-1) as events:
            again = await client.post(f"/sessions/{ids[0]}/messages", json={"message": "more"})
            assert again.status_code == 202, again.text
            await events.until("run_finished")
            await events.until("run_finished")
        view = (await client.get(f"/sessions/{ids[0]}")).json()
        assert view["history"]["entries"] == 4
        assert len(marked("AF_OWNERSHIP_MARKER", marker)) == 1
    assert marked("AF_OWNERSHIP_MARKER", marker) == []


async def test_sessions_on_one_endpoint_share_one_sdk_client(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARED_TEST_KEY", "sk-shared-0123456789")
    openai_server.script(*(sse_reply(text_chunks(f"answer {n}")) for n in range(3)))
    config = AgentConfig(
        context=ContextConfig(counter="approx"),
        llm={"model": "m", "base_url": openai_server.base_url, "api_key_env": "SHARED_TEST_KEY"},
    )
    app = create_app(config, store=InMemorySessionStore())
    manager: SessionManager = app.state.manager
    async with serving(app) as client:
        for _ in range(3):
            sid = (await client.post("/sessions", json={})).json()["id"]
            async with stream(client, f"/sessions/{sid}/events") as events:
                await client.post(f"/sessions/{sid}/messages", json={"message": "hi"})
                await events.until("run_finished")
        assert len(manager.clients) == 1
    assert len(openai_server.requests) == 3
    assert len(manager.clients) == 0  # closed at shutdown


async def test_a_message_cancelled_while_it_hands_watchers_a_dead_run_s_end_keeps_no_claim() -> (
    None
):
    """The claim is the run's from the moment it is taken: a send cancelled before its run
    started (here, held by a watcher that fell behind while it publishes the end of a dead
    process's run) gives it back, and the session takes the next message."""
    from agent_flow.events import WarningRaised
    from agent_flow.server.models import CreateSession

    store = InMemorySessionStore()
    manager = _manager(store)
    try:
        info = await manager.create(CreateSession(title="t"))
        await store.claim(info.id, run_id="dead-run", holder="1@elsewhere", ttl=0)
        live = manager.loaded(info.id)
        assert live is not None
        behind = live.bus.subscribe(policy="wait", maxsize=1, max_wait=5.0)
        await live.bus.publish(WarningRaised(run_id="x", seq=0, message="m", source="s"))
        sending = asyncio.create_task(manager.send(info.id, "hello"))
        async with asyncio.timeout(5):
            while (await store.info(info.id)).lease_run in (None, "dead-run"):  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # (the store's state: no event to wait on)
        await asyncio.sleep(0.05)  # held in the publish, behind the full watcher
        assert not sending.done()
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        await behind.aclose()
        assert live.recorder is not None and live.recorder.lease is None
        assert (await store.info(info.id)).lease_run is None
        run_id, _ = await manager.send(info.id, "again")  # not 409: nobody holds it
        assert live.task is not None
        await live.task
        assert (await store.info(info.id)).lease_run is None
        assert [e.run_id for e in await store.events(info.id) if e.kind == "run_finished"][
            -1
        ] == run_id
    finally:
        await manager.aclose()


async def test_a_message_that_loads_its_session_as_the_server_shuts_down_starts_nothing() -> None:
    """Shutdown closes the sessions loaded when it begins; one a message was loading then
    (the store slow to answer) is refused with 503, and no run, claim or MCP server is left."""
    from agent_flow.server._errors import ApiError
    from tests.server_harness import marked

    class SlowInfo(InMemorySessionStore):
        slow = False

        async def info(self, session_id: str) -> Any:
            if self.slow:
                await asyncio.sleep(0.3)
            return await super().info(session_id)

    marker = f"shutdown-in-load-{os.getpid()}"
    config = AgentConfig(
        context=ContextConfig(counter="approx"),
        mcp_servers=[stdio_server("basic", "basic_server.py", env={"AF_TEST_MCP": marker})],
    )
    store = SlowInfo()
    info = await store.create(agent=config.name, title="t")  # stored, not loaded
    manager = SessionManager(
        config, store, ServerSettings(), llm_factory=lambda c: FunctionLLM(lambda r: reply("hi"))
    )
    store.slow = True
    sending = asyncio.create_task(manager.send(info.id, "hello"))
    await asyncio.sleep(0.1)  # it is loading the session: the store has not answered
    await manager.aclose()
    with pytest.raises(ApiError) as refused:
        await sending
    assert refused.value.status == 503 and refused.value.code == "shutting_down"
    store.slow = False
    assert (await store.info(info.id)).lease_run is None
    live = manager.loaded(info.id)
    assert live is None or (live.agent is None and not live.running)
    assert marked("AF_TEST_MCP", marker) == []


async def test_a_delete_ends_the_claim_its_own_finished_run_could_not_give_back() -> None:
    """A run of this server ended but its release failed (logged; the claim would expire by
    itself): a DELETE then is not refused as if the run were another process's."""
    from agent_flow.errors import StoreError
    from agent_flow.server._errors import ApiError
    from agent_flow.server.models import CreateSession

    class ReleaseFailsOnce(InMemorySessionStore):
        failed = False

        async def release(self, lease: Any) -> None:
            if not self.failed and not lease.run_id.startswith(("delete-", "recover-")):
                self.failed = True
                raise StoreError("connection lost")
            await super().release(lease)

    store = ReleaseFailsOnce()
    manager = _manager(store)
    try:
        info = await manager.create(CreateSession(title="t"))
        run_id, _ = await manager.send(info.id, "hello")
        live = manager.loaded(info.id)
        assert live is not None and live.task is not None
        await live.task
        assert store.failed and (await store.info(info.id)).lease_run == run_id
        await manager.delete(info.id)
        assert await store.list() == []
        # Another process's live run is another matter: refused, and said so.
        other = await manager.create(CreateSession(title="u"))
        await store.claim(other.id, run_id="theirs", holder="1@elsewhere", ttl=3600)
        with pytest.raises(ApiError) as refused:
            await manager.delete(other.id)
        assert (refused.value.status, refused.value.code) == (409, "run_in_progress")
        assert "theirs in another process" in str(refused.value)
        assert [s.id for s in await store.list()] == [other.id]
    finally:
        await manager.aclose()


async def test_a_delete_waits_for_the_load_that_ends_a_dead_run_not_refused_by_it() -> None:
    """Loading a session a dead process left claimed ends that run under a brief claim of
    its own; a DELETE (or a message) that arrives meanwhile waits for it, not a 409."""

    class SlowRecoverRelease(InMemorySessionStore):
        async def release(self, lease: Any) -> None:
            if lease.run_id.startswith("recover-"):
                await asyncio.sleep(0.2)  # a slow round trip
            await super().release(lease)

    store = SlowRecoverRelease()
    info = await store.create(agent="agent", title="t")
    await store.claim(info.id, run_id="dead", holder="1@other-host", ttl=0)  # expired
    manager = _manager(store)
    try:
        loading = asyncio.create_task(manager.live(info.id))  # a watcher, say
        async with asyncio.timeout(5):
            while (await store.info(info.id)).lease_run in (None, "dead"):  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # until the recovery's claim is taken
        await manager.delete(info.id)
        await loading
        assert await store.list() == []
    finally:
        await manager.aclose()


async def test_a_shutdown_cancelled_midway_still_stops_every_session() -> None:
    """A second Ctrl-C, a lifespan timeout: the cancellation is held until every session's
    run is stopped and its agent closed, then raised, even for the session whose lock the
    shutdown was waiting for when it came."""
    from agent_flow.server.models import CreateSession

    store = InMemorySessionStore()
    manager = _manager(store)
    one = await manager.create(CreateSession(title="1"))
    two = await manager.create(CreateSession(title="2"))
    await manager.resume(two.id)  # an agent built
    first, second = manager.loaded(one.id), manager.loaded(two.id)
    assert first is not None and second is not None and second.agent is not None
    first.task = asyncio.create_task(asyncio.sleep(3600))  # stands for a run
    let_go = asyncio.Event()

    async def busy() -> None:  # a request holding the first session meanwhile
        async with first.lock:
            await let_go.wait()

    holding = asyncio.create_task(busy())
    await asyncio.sleep(0)
    closing = asyncio.create_task(manager.aclose())
    await asyncio.sleep(0.02)
    closing.cancel()
    await asyncio.sleep(0.02)
    let_go.set()
    await holding
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert first.task.done() and first.closed
    assert second.agent is None and second.closed


async def test_a_cancel_that_ends_a_dead_run_leaves_the_agent_it_made_stale_out_of_date() -> None:
    """Server B asked to cancel ends a dead run's claim under a claim of its own; that claim
    must not make B's agent, built before another server's run, pass for up to date (its next
    run saved its old history over the other run's turn)."""
    prompts: list[list[str]] = []

    def model(request: Any) -> Any:
        prompts.append([str(message.content) for message in request.messages])
        return reply("hi")

    def manager(store: Any) -> SessionManager:
        config = AgentConfig(context=ContextConfig(counter="approx"))
        factory = lambda config: FunctionLLM(model)  # noqa: E731
        return SessionManager(config, store, ServerSettings(), llm_factory=factory)

    async def run(server: SessionManager, sid: str, message: str) -> None:
        await server.send(sid, message)
        live = server.loaded(sid)
        assert live is not None and live.task is not None
        await live.task

    store = InMemorySessionStore()
    a, b = manager(store), manager(store)
    try:
        sid = (await b.create(CreateSession())).id
        await run(b, sid, "one")
        await run(a, sid, "two")
        await store.claim(sid, run_id="dead", holder="1@other-host", ttl=0)  # expired: dead
        with pytest.raises(ApiError) as refused:
            await b.cancel(sid)
        assert (refused.value.status, refused.value.code) == (409, "not_running")
        await run(b, sid, "three")
        assert [p for p in prompts[-1] if p in ("one", "two", "three")] == ["one", "two", "three"]
        state = await store.load(sid)
        kept = [entry.content for entry in state.entries if isinstance(entry, UserMessage)]
        assert kept == ["one", "two", "three"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_an_agent_built_while_another_server_runs_the_session_is_built_again_after() -> None:
    """`POST /resume` (and every AG-UI request) builds a session's agent without claiming
    it: built while another server's run held the claim, it is behind that run, and the next
    run here must build it again, not run (and save) a history without that run's end."""
    gate = asyncio.Event()
    prompts: list[list[str]] = []

    def manager(store: Any, *, held: bool) -> SessionManager:
        async def model(request: Any) -> Any:
            if held:
                await gate.wait()
            prompts.append([str(m.content) for m in request.messages if m.role == "user"])
            return reply("hi")

        config = AgentConfig(context=ContextConfig(counter="approx"))
        factory = lambda config: FunctionLLM(model)  # noqa: E731
        return SessionManager(config, store, ServerSettings(), llm_factory=factory)

    store = InMemorySessionStore()
    a, b = manager(store, held=True), manager(store, held=False)
    try:
        sid = (await a.create(CreateSession())).id
        await a.send(sid, "one")  # A's run holds the claim, waiting for its model
        await b.resume(sid)  # B builds its agent meanwhile
        gate.set()
        live_a = a.loaded(sid)
        assert live_a is not None and live_a.task is not None
        await live_a.task
        await b.send(sid, "two")
        live_b = b.loaded(sid)
        assert live_b is not None and live_b.task is not None
        await live_b.task
        assert prompts[-1] == ["one", "two"]
        state = await store.load(sid)
        kept = [entry.content for entry in state.entries if isinstance(entry, UserMessage)]
        assert kept == ["one", "two"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_cancel_that_found_no_run_does_not_cancel_the_turn_sent_after_it() -> None:
    """A "stop" that found no run, still reading the session's claim when the next message
    started a run, answers 409: that later run is not the one it was sent for."""

    class SlowInfo(InMemorySessionStore):
        slow = False

        async def info(self, session_id: str) -> Any:
            info = await super().info(session_id)
            if self.slow:  # the cancel's read of the claim: answered late
                self.slow = False
                await asyncio.sleep(0.2)
            return info

    async def model(request: Any) -> Any:
        await asyncio.sleep(0.3)
        return reply("hi")

    store = SlowInfo()
    config = AgentConfig(context=ContextConfig(counter="approx"))
    manager = SessionManager(
        config, store, ServerSettings(), llm_factory=lambda config: FunctionLLM(model)
    )
    try:
        sid = (await manager.create(CreateSession())).id
        await manager.send(sid, "one")
        live = manager.loaded(sid)
        assert live is not None and live.task is not None
        await live.task
        store.slow = True
        cancel = asyncio.create_task(manager.cancel(sid))
        await asyncio.sleep(0.05)
        await manager.send(sid, "two")
        with pytest.raises(ApiError) as refused:
            await cancel
        assert refused.value.code == "not_running"
        assert live.task is not None
        outcome = await live.task
        assert getattr(outcome, "stop_reason", None) == "answered", outcome
    finally:
        await manager.aclose()


async def test_a_message_cancelled_before_its_run_leaves_nothing_its_start_wrote() -> None:
    """What a send's `start` wrote into the agent (an AG-UI request writes the client's
    state, context and earlier messages) belongs to a run that never ran when the send is
    cancelled before the run starts: the next run builds the agent again, without it."""
    from agent_flow.events import WarningRaised

    def start(agent: Any, run_id: str) -> Any:
        agent.history.add(UserMessage(content="GHOST"))
        return agent.send("ignored", run_id=run_id)

    store = InMemorySessionStore()
    manager = _manager(store)
    try:
        sid = (await manager.create(CreateSession(title="t"))).id
        await manager.send(sid, "one")
        live = manager.loaded(sid)
        assert live is not None and live.task is not None
        await live.task
        await store.claim(sid, run_id="dead-run", holder="1@elsewhere", ttl=0)  # expired
        behind = live.bus.subscribe(policy="wait", maxsize=1, max_wait=5.0)
        await live.bus.publish(WarningRaised(run_id="x", seq=0, message="m", source="s"))
        sending = asyncio.create_task(manager.send(sid, "ignored", start=start))
        async with asyncio.timeout(5):
            while (await store.info(sid)).lease_run in (None, "dead-run"):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # held in the publish of the dead run's end
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        await behind.aclose()
        await manager.send(sid, "two")
        assert live.task is not None
        await live.task
        state = await store.load(sid)
        kept = [entry.content for entry in state.entries if isinstance(entry, UserMessage)]
        assert kept == ["one", "two"]
    finally:
        await manager.aclose()
