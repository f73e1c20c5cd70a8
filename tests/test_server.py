"""The HTTP service against a real uvicorn on a loopback port, with real HTTP and SSE clients.

The model is a `ScriptedLLM` per session (through ``llm_factory``), or the real OpenAI client
talking to the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import socket
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
from pydantic import ValidationError

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import Environment
from agent_flow.llm.base import LLMClient
from agent_flow.server import ServerSettings, create_app
from agent_flow.sessions import InMemorySessionStore, SessionState, SQLiteSessionStore, event_id
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import RiskLevel, ToolExecutor, ToolPolicy, tool
from tests.openai_server import OpenAIServer, sse_reply, text_chunks
from tests.server_harness import EventStream, serving, stream


@tool(policy=ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH))
def deploy(target: str) -> str:
    """Deploy somewhere.

    Args:
        target: Where.
    """
    return f"deployed to {target}"


def _config(**fields: object) -> AgentConfig:
    return AgentConfig(context=ContextConfig(counter="approx"), **fields)  # type: ignore[arg-type]


def _tools(config: AgentConfig) -> ToolExecutor:
    executor = ToolExecutor()
    executor.register(deploy)
    return executor


class Models:
    """Hands each new session the next scripted model."""

    def __init__(self, *models: ScriptedLLM) -> None:
        self.models = list(models)

    def __call__(self, config: AgentConfig) -> LLMClient:
        return self.models.pop(0)


def _approving_script() -> ScriptedLLM:
    return ScriptedLLM(
        [
            reply("deploying", tool_calls=[call("deploy", target="prod", call_id="c1")]),
            reply("all done"),
        ]
    )


@pytest.fixture
def store() -> InMemorySessionStore:
    return InMemorySessionStore()


async def _create(client: httpx2.AsyncClient, **body: object) -> str:
    response = await client.post("/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def test_a_run_streams_its_events_numbered_and_an_approval_is_answered_over_http(
    store: InMemorySessionStore,
) -> None:
    app = create_app(
        _config(), store=store, llm_factory=Models(_approving_script()), tools_factory=_tools
    )
    async with serving(app) as client:
        sid = await _create(client, title="deploy")
        async with stream(client, f"/sessions/{sid}/events") as events:
            sent = await client.post(f"/sessions/{sid}/messages", json={"message": "deploy it"})
            assert sent.status_code == 202
            run_id = sent.json()["run_id"]
            assert sent.json()["first_event_id"] == event_id(1, 0)
            before = await events.until("approval_required")
            # A second message while the run waits: 409 naming the running run.
            busy = await client.post(f"/sessions/{sid}/messages", json={"message": "again"})
            assert busy.status_code == 409
            assert busy.json()["run_id"] == run_id and busy.json()["code"] == "run_in_progress"
            view = (await client.get(f"/sessions/{sid}")).json()
            assert view["state"] == "running"
            assert [a["call_id"] for a in view["pending_approvals"]] == ["c1"]
            wrong = await client.post(f"/sessions/{sid}/approvals/nope", json={"approved": True})
            assert wrong.status_code == 409 and wrong.json()["field"] == "call_id"
            ok = await client.post(f"/sessions/{sid}/approvals/c1", json={"approved": True})
            assert ok.status_code == 204
            after = await events.until("run_finished")
        frames = before + after
        ids = [int(frame.id) for frame in frames if frame.id is not None]
        # An id is the run's fence (its claim on the session: the first) and the event's seq.
        assert ids == [event_id(1, seq) for seq in range(len(frames))]
        assert all(frame.json["run_id"] == run_id for frame in frames)
        assert [event_id(1, f.json["seq"]) for f in frames] == ids
        done = next(f for f in frames if f.event == "tool_call_completed").json
        assert done["content"] == "deployed to prod"
        assert frames[-1].json["final_text"] == "all done"
        # The answer went to the store too: the session reads back complete.
        view = (await client.get(f"/sessions/{sid}")).json()
        assert view["state"] == "idle" and view["status"] == "completed"
        assert view["event_count"] == len(frames)
        calls = [f.json for f in frames if f.event == "model_responded"]
        listed = (await client.get("/sessions")).json()["sessions"][0]
        for shown in (view, listed):  # the session's usage over its runs, as the store keeps it
            assert shown["model_calls"] == len(calls) == 2
            assert shown["prompt_tokens"] == sum(c["prompt_tokens"] for c in calls)
            assert shown["completion_tokens"] == sum(c["completion_tokens"] for c in calls)
            assert (shown["cost_usd"] is None) == (shown["unpriced_calls"] > 0)
        assert view["environment"]["task"]["objective"] == "deploy it"
        assert view["last_prompt"]["budget"] == _config().context.max_tokens
        assert view["history"]["entries"] >= 4 and view["pending_approvals"] == []


async def test_a_reconnect_with_last_event_id_gets_what_it_missed_then_the_live_stream(
    store: InMemorySessionStore,
) -> None:
    model = ScriptedLLM(
        [
            reply("one"),
            reply("deploying", tool_calls=[call("deploy", target="prod", call_id="c1")]),
            reply("all done"),
        ]
    )
    app = create_app(_config(), store=store, llm_factory=Models(model), tools_factory=_tools)
    async with serving(app) as client:
        sid = await _create(client)
        async with stream(client, f"/sessions/{sid}/events") as events:
            await client.post(f"/sessions/{sid}/messages", json={"message": "first"})
            run1 = await events.until("run_finished")
            await client.post(f"/sessions/{sid}/messages", json={"message": "now deploy"})
            partial = await events.until("tool_call_started")
        # Disconnected mid-run; the run goes on and waits for approval meanwhile.
        seen = run1 + partial
        last = seen[-1].id
        assert last is not None
        # Three watchers at once: one resuming by header, one by query, one from the start.
        async with (
            stream(client, f"/sessions/{sid}/events", headers={"Last-Event-ID": last}) as resumed,
            stream(client, f"/sessions/{sid}/events", after=seen[2].id) as by_query,
            stream(client, f"/sessions/{sid}/events") as whole,
        ):
            missed = await resumed.until("approval_required")
            answer = await client.post(f"/sessions/{sid}/approvals/c1", json={"approved": False})
            assert answer.status_code == 204
            rest = await resumed.until("run_finished")
            # The other two read both runs: the first from the store, the second live.
            from_query = await by_query.until("run_finished") + await by_query.until("run_finished")
            everything = await whole.until("run_finished") + await whole.until("run_finished")
        ids = [int(f.id) for f in [*seen, *missed, *rest] if f.id is not None]
        # No gap, no duplicate across the reconnect: each run's ids follow its fence.
        assert ids == [event_id(1, n) for n in range(len(run1))] + [
            event_id(2, n) for n in range(len(ids) - len(run1))
        ]
        assert [f.data for f in everything] == [f.data for f in [*seen, *missed, *rest]]
        assert [int(f.id) for f in from_query if f.id] == ids[3:]
        failed = next(f for f in rest if f.event == "tool_call_failed").json
        assert failed["call_id"] == "c1"
        # Replay without following ends after the stored events.
        async with stream(client, f"/sessions/{sid}/events", follow="false", after=-1) as replay:
            stored = await replay.rest()
        assert [f.data for f in stored] == [f.data for f in everything]


async def test_an_unanswered_approval_is_denied_after_the_timeout(
    store: InMemorySessionStore,
) -> None:
    settings = ServerSettings(approval_timeout=0.01)
    app = create_app(
        _config(),
        store=store,
        settings=settings,
        llm_factory=Models(_approving_script()),
        tools_factory=_tools,
    )
    async with serving(app) as client:
        sid = await _create(client)
        async with stream(client, f"/sessions/{sid}/events") as events:
            await client.post(f"/sessions/{sid}/messages", json={"message": "deploy"})
            frames = await events.until("run_finished")
        resolved = next(f for f in frames if f.event == "approval_resolved").json
        assert resolved["approved"] is False and "within" in resolved["reason"]
        late = await client.post(f"/sessions/{sid}/approvals/c1", json={"approved": True})
        assert late.status_code == 409


async def test_cancel_ends_the_run_as_cancelled_and_409_when_idle(
    store: InMemorySessionStore,
) -> None:
    app = create_app(
        _config(), store=store, llm_factory=Models(_approving_script()), tools_factory=_tools
    )
    async with serving(app) as client:
        sid = await _create(client)
        idle = await client.post(f"/sessions/{sid}/cancel", json={})
        assert idle.status_code == 409 and idle.json()["code"] == "not_running"
        async with stream(client, f"/sessions/{sid}/events") as events:
            run_id = (
                await client.post(f"/sessions/{sid}/messages", json={"message": "go"})
            ).json()["run_id"]
            await events.until("approval_required")
            cancelled = await client.post(f"/sessions/{sid}/cancel", json={})
            assert cancelled.status_code == 200 and cancelled.json()["run_id"] == run_id
            frames = await events.until("run_finished")
        assert frames[-1].json["stop_reason"] == "cancelled"
        assert (await client.get(f"/sessions/{sid}")).json()["status"] == "cancelled"


async def test_a_session_resumes_after_a_restart_and_exports_then_deletes(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    async with SQLiteSessionStore(path) as store:
        app = create_app(_config(), store=store, llm_factory=Models(ScriptedLLM([reply("hi")])))
        async with serving(app) as client:
            sid = await _create(client, session_id="keep-me")
            async with stream(client, f"/sessions/{sid}/events") as events:
                await client.post(f"/sessions/{sid}/messages", json={"message": "remember 42"})
                first = await events.until("run_finished")
    model = ScriptedLLM([reply("it was 42")])
    async with SQLiteSessionStore(path) as store:
        app = create_app(_config(), store=store, llm_factory=Models(model))
        async with serving(app) as client:
            listed = (await client.get("/sessions")).json()["sessions"]
            assert [s["id"] for s in listed] == ["keep-me"]
            resumed = await client.post("/sessions/keep-me/resume", json={})
            assert resumed.status_code == 200 and resumed.json()["history"]["entries"] == 2
            async with stream(
                client, "/sessions/keep-me/events", headers={"Last-Event-ID": first[-1].id or ""}
            ) as events:
                sent = await client.post("/sessions/keep-me/messages", json={"message": "what?"})
                # The second run's claim took the next fence, in the store: after a restart
                # too, its ids are above every id the first run handed out.
                assert sent.json()["first_event_id"] == event_id(2, 0)
                second = await events.until("run_finished")
            assert [int(f.id or -1) for f in second] == [event_id(2, n) for n in range(len(second))]
            prompt = [m.content for m in model.last_request.messages]
            assert "remember 42" in str(prompt) and "hi" in str(prompt)
            exported = await client.get("/sessions/keep-me/export")
            assert exported.status_code == 200
            lines = exported.text.splitlines()
            assert '"remember 42"' in exported.text and len(lines) > len(first)
            assert (await client.delete("/sessions/keep-me")).status_code == 204
            gone = await client.get("/sessions/keep-me")
            assert gone.status_code == 404 and gone.json()["field"] == "session_id"


async def test_bad_input_gets_a_precise_4xx_naming_the_field(
    store: InMemorySessionStore, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "project").mkdir(parents=True)
    settings = ServerSettings(max_body_bytes=2000, workspace_roots=(root,))
    app = create_app(_config(), store=store, settings=settings, llm_factory=Models())
    async with serving(app) as client:
        malformed = await client.post(
            "/sessions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 400 and malformed.json()["code"] == "malformed_json"
        unknown = await client.get("/sessions/nobody")
        assert unknown.status_code == 404
        bad_id = await client.get("/sessions/..%2Fetc")
        assert bad_id.status_code in (404, 422)
        bad_id = await client.get("/sessions/-x")
        assert bad_id.status_code == 422 and bad_id.json()["field"] == "session_id"
        huge = await client.post("/sessions", json={"title": "x" * 5000})
        assert huge.status_code == 413 and huge.json()["code"] == "body_too_large"
        small = await client.post("/sessions", json={"max_tokens": 3})
        assert small.status_code == 422 and small.json()["field"] == "max_tokens"
        extra = await client.post("/sessions", json={"api_key": "sk-x"})
        assert extra.status_code == 422 and extra.json()["field"] == "api_key"
        outside = await client.post("/sessions", json={"workspace": str(tmp_path)})
        assert outside.status_code == 422 and outside.json()["field"] == "workspace"
        escape = await client.post(
            "/sessions", json={"workspace": str(root / "project" / ".." / "..")}
        )
        assert escape.status_code == 422
        skill = await client.post("/sessions", json={"skill": "nope"})
        assert skill.status_code == 422 and skill.json()["field"] == "skill"
        inside = await client.post("/sessions", json={"workspace": str(root / "project")})
        assert inside.status_code == 201
        assert inside.json()["options"]["workspace"] == str(root / "project")
        taken = await client.post("/sessions", json={"session_id": inside.json()["id"]})
        assert taken.status_code == 409
        header = await client.get(
            f"/sessions/{inside.json()['id']}/events", headers={"Last-Event-ID": "abc"}
        )
        assert header.status_code == 400 and header.json()["field"] == "Last-Event-ID"
        # Past the largest id a store keeps (a signed 64-bit integer): refused, not a stream
        # cut short after its 200 when the store cannot take the number.
        events = f"/sessions/{inside.json()['id']}/events"
        past = await client.get(events, headers={"Last-Event-ID": str(2**63)})
        assert past.status_code == 400 and past.json()["code"] == "bad_last_event_id"
        past = await client.get(events, params={"after": 2**63, "follow": "false"})
        assert past.status_code == 422 and past.json()["field"] == "after"
        last = await client.get(
            events, params={"follow": "false"}, headers={"Last-Event-ID": str(2**63 - 1)}
        )
        assert last.status_code == 200 and last.text == ""


async def test_off_loopback_needs_a_token_and_the_token_guards_every_route_incl_sse(
    store: InMemorySessionStore,
) -> None:
    with pytest.raises(ValidationError, match="bearer token"):
        ServerSettings(host="0.0.0.0")
    settings = ServerSettings(host="0.0.0.0", token="s3cret", cors_origins=("http://ui.test",))
    app = create_app(_config(), store=store, settings=settings, llm_factory=Models())
    async with serving(app) as client:
        for method, path in [
            ("GET", "/sessions"),
            ("POST", "/sessions"),
            ("GET", "/sessions/a/events"),
        ]:
            refused = await client.request(method, path, json={} if method == "POST" else None)
            assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
        wrong = await client.get("/sessions", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert (await client.get("/sessions", headers=auth)).status_code == 200
        preflight = await client.options(
            "/sessions",
            headers={"Origin": "http://ui.test", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.headers["access-control-allow-origin"] == "http://ui.test"


async def test_idle_streams_get_keep_alive_comments(store: InMemorySessionStore) -> None:
    settings = ServerSettings(keepalive_seconds=0.01)
    app = create_app(_config(), store=store, settings=settings, llm_factory=Models())
    async with serving(app) as client:
        sid = await _create(client)
        comments: list[str] = []
        async with client.stream("GET", f"/sessions/{sid}/events") as response:
            events = EventStream(response, comments=comments)
            await events.until("comment")
        assert comments[0] == ": ping"


async def test_the_real_openai_client_runs_and_no_key_appears_anywhere(
    store: InMemorySessionStore, openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-very-secret-value-123"
    monkeypatch.setenv("SERVER_TEST_KEY", secret)
    openai_server.script(sse_reply(text_chunks("hello from the wire")))
    config = _config(
        llm={
            "model": "m",
            "models": ["other-model"],
            "base_url": openai_server.base_url,
            "api_key_env": "SERVER_TEST_KEY",
        }
    )
    app = create_app(config, store=store)
    seen: list[str] = []
    async with serving(app) as client:
        created = await client.post("/sessions", json={"model": "other-model"})
        seen.append(created.text)
        sid = created.json()["id"]
        async with stream(client, f"/sessions/{sid}/events") as events:
            seen.append(
                (await client.post(f"/sessions/{sid}/messages", json={"message": "hi"})).text
            )
            frames = await events.until("run_finished")
        seen += [f.data for f in frames]
        for path in (f"/sessions/{sid}", "/sessions", f"/sessions/{sid}/export", "/openapi.json"):
            seen.append((await client.get(path)).text)
    assert frames[-1].json["final_text"] == "hello from the wire"
    assert openai_server.requests[0].body["model"] == "other-model"
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {secret}"
    assert not [text for text in seen if secret in text]


def test_serve_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    import io

    from agent_flow.cli import main

    err = io.StringIO()
    argv = ["serve", "--host", "0.0.0.0", "--no-token", "--db", str(tmp_path / "s.db")]
    code = main(argv, stderr=err)
    assert code == 2
    assert "bearer token" in err.getvalue() and "0.0.0.0" in err.getvalue()


async def _stalled_stream(
    client: httpx2.AsyncClient, path: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open an SSE stream on a socket with a tiny receive window, and read nothing yet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    url = client.base_url
    await asyncio.get_running_loop().sock_connect(sock, (url.host, url.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {url.host}\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def _read_chunked_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    """The body of a chunked response, read until a chunk holds `marker`."""
    await reader.readuntil(b"\r\n\r\n")
    body = b""
    while marker not in body:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        body += await reader.readexactly(size + 2)
    return body


async def test_a_client_that_stops_reading_holds_up_neither_the_run_nor_other_watchers(
    store: InMemorySessionStore,
) -> None:
    # A megabyte of events against a connection whose buffers take a few KB: writes to the
    # stalled client stop finishing at once, and under drop_oldest its 8 queued events make
    # room by dropping.
    words = " ".join(f"word{n}" for n in range(100_000))
    model = ScriptedLLM([reply(words, chunk_size=4096)])
    settings = ServerSettings(watcher_queue=8)
    app = create_app(_config(), store=store, settings=settings, llm_factory=Models(model))
    async with serving(app, send_buffer=4096) as client:
        sid = await _create(client)
        stalled, connection = await _stalled_stream(
            client, f"/sessions/{sid}/events?policy=drop_oldest"
        )
        async with stream(client, f"/sessions/{sid}/events", policy="wait") as reading:
            await client.post(f"/sessions/{sid}/messages", json={"message": "talk"})
            frames = await reading.until("run_finished")
        ids = [int(frame.id) for frame in frames if frame.id is not None]
        assert ids == [event_id(1, n) for n in range(len(frames))] and len(frames) > 200
        body = (await _read_chunked_until(stalled, b"event: run_finished")).decode()
        connection.close()
        await connection.wait_closed()
    kinds = re.findall(r"^event: (\w+)$", body, flags=re.MULTILINE)
    seen = [int(found) for found in re.findall(r"^id: (\d+)$", body, flags=re.MULTILINE)]
    assert "events_dropped" in kinds and kinds[-1] == "run_finished"
    assert seen == sorted(set(seen)) and seen[-1] == ids[-1] and len(seen) < len(ids)


async def test_a_stored_sessions_view_counts_its_history_with_the_agents_counter(
    tmp_path: Path,
) -> None:
    """The view of a session no agent holds (after a restart) counts its stored history as
    the session's agent would (here approximately), not with a tokenizer of its own."""
    from agent_flow.tokens import ApproxCounter, TiktokenCounter

    path = tmp_path / "sessions.db"
    message = "请记住这个号码四十二" * 40  # a text the two counters count fourfold apart
    async with SQLiteSessionStore(path) as store:
        app = create_app(_config(), store=store, llm_factory=Models(ScriptedLLM([reply("hi")])))
        async with serving(app) as client:
            sid = await _create(client)
            async with stream(client, f"/sessions/{sid}/events") as events:
                await client.post(f"/sessions/{sid}/messages", json={"message": message})
                await events.until("run_finished")
    async with SQLiteSessionStore(path) as store:
        state = await store.load(sid)
        approx = state.history(counter=ApproxCounter()).token_count()
        assert approx != state.history(counter=TiktokenCounter()).token_count()
        app = create_app(_config(), store=store, llm_factory=Models())
        async with serving(app) as client:
            view = (await client.get(f"/sessions/{sid}")).json()
    assert view["history"]["tokens"] == approx


class _CountingLoads(InMemorySessionStore):
    """A memory store that counts the sessions it loads whole."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    async def load(self, session_id: str) -> SessionState:
        self.loads += 1
        return await super().load(session_id)


async def test_a_new_sessions_view_is_built_without_loading_it_and_is_what_a_load_shows() -> None:
    store = _CountingLoads()
    app = create_app(_config(), store=store, llm_factory=Models(ScriptedLLM(["done"])))
    async with serving(app) as client:
        created = (await client.post("/sessions", json={"title": "t"})).json()
        shown = (await client.get(f"/sessions/{created['id']}")).json()
        assert store.loads == 0  # nothing but the row is stored yet
        assert created == shown
        assert created["history"] == {"entries": 0, "tokens": 0, "kinds": {}}
        assert created["environment_version"] == 0 and created["last_prompt"] is None
        stored = await store.load(created["id"])
        assert stored.entries == () and stored.environment is None
        assert created["environment"] == json.loads(Environment().to_json())["state"]


async def test_a_session_made_on_one_server_and_run_on_another_shows_the_run_on_the_first(
    tmp_path: Path,
) -> None:
    """The view skips the load only while nothing is stored, read from the store each time."""
    path = tmp_path / "shared.db"
    first, second = SQLiteSessionStore(path), SQLiteSessionStore(path)
    async with first, second:
        made_on = create_app(_config(), store=first, llm_factory=Models(ScriptedLLM(["unused"])))
        run_on = create_app(_config(), store=second, llm_factory=Models(ScriptedLLM(["done"])))
        async with serving(made_on) as a, serving(run_on) as b:
            sid = (await a.post("/sessions", json={})).json()["id"]
            assert (await a.get(f"/sessions/{sid}")).json()["history"]["entries"] == 0
            async with stream(b, f"/sessions/{sid}/events") as events:
                sent = await b.post(f"/sessions/{sid}/messages", json={"message": "hi"})
                assert sent.status_code == 202
                await events.until("run_finished")
            shown = (await a.get(f"/sessions/{sid}")).json()
    assert shown["history"]["entries"] == 2
    assert shown["history"]["kinds"] == {"UserMessage": 1, "AgentMessage": 1}
    assert shown["environment"]["task"]["objective"] == "hi"


async def test_a_server_without_any_model_says_how_its_operator_gives_one() -> None:
    config = AgentConfig(context=ContextConfig(counter="approx"))  # no [agent.llm], no [llms]
    app = create_app(config, store=InMemorySessionStore())
    async with serving(app) as client:
        assert (await client.get("/endpoints")).json()["endpoints"] == []
        refused = await client.post("/sessions", json={})
    assert refused.status_code == 422 and refused.json()["field"] == "model"
    assert refused.json()["message"].endswith(
        "; this server has no model endpoint: its operator starts it with --config agent.toml "
        "naming one ([agent.llm] or [llms.NAME])"
    )


def _dependency_calls(dependant: object) -> list[object]:
    calls: list[object] = []
    for sub in getattr(dependant, "dependencies", []):
        calls.append(sub.call)
        calls.extend(_dependency_calls(sub))
    return calls


def test_every_route_and_dependency_is_a_coroutine_so_no_request_hops_to_a_thread() -> None:
    # FastAPI runs a plain function's route or dependency on a worker thread: a hand-off per
    # request (two context switches and anyio's thread machinery) for a few lookups.
    from fastapi.routing import APIRoute

    app = create_app(_config(), store=InMemorySessionStore(), llm_factory=Models())
    routes = [route for route in app.routes if isinstance(route, APIRoute)]
    assert len(routes) >= 10
    for route in routes:
        for function in (route.endpoint, *_dependency_calls(route.dependant)):
            assert inspect.iscoroutinefunction(function), f"{route.path}: {function!r} is not async"


async def test_a_whole_session_over_http_never_waits_for_a_worker_thread(
    store: InMemorySessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastapi.dependencies.utils
    import fastapi.routing
    from starlette.concurrency import run_in_threadpool

    hops: list[str] = []

    async def counted(func: object, *args: object, **kwargs: object) -> object:
        hops.append(getattr(func, "__name__", repr(func)))
        return await run_in_threadpool(func, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fastapi.dependencies.utils, "run_in_threadpool", counted)
    monkeypatch.setattr(fastapi.routing, "run_in_threadpool", counted)
    app = create_app(
        _config(), store=store, llm_factory=Models(_approving_script()), tools_factory=_tools
    )
    async with serving(app) as client:
        sid = await _create(client, title="deploy")
        async with stream(client, f"/sessions/{sid}/events?after=-1") as events:
            sent = await client.post(f"/sessions/{sid}/messages", json={"message": "deploy it"})
            assert sent.status_code == 202
            await events.until("approval_required")
            assert (await client.get(f"/sessions/{sid}/approvals")).status_code == 200
            ok = await client.post(f"/sessions/{sid}/approvals/c1", json={"approved": True})
            assert ok.status_code == 204
            await events.until("run_finished")
        assert (await client.get("/sessions")).status_code == 200
        assert (await client.get(f"/sessions/{sid}/export")).status_code == 200
        assert (await client.delete(f"/sessions/{sid}")).status_code == 204
    assert hops == []
