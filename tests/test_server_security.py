"""The service against hostile clients, on a real uvicorn on loopback (README "Security model").

Each test is an attack from outside: a foreign ``Host`` (DNS rebinding), a foreign ``Origin``,
a cross-origin form, a client-chosen model endpoint, another user's session ids, missing or
wrong tokens. Keys are watched by a second scripted OpenAI server that records every
``Authorization`` header it receives.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.errors import ConfigError
from agent_flow.llm.base import LLMClient
from agent_flow.server import ServerSettings, create_app
from agent_flow.server._auth import Users
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, reply
from tests.openai_server import OpenAIServer, sse_reply, text_chunks
from tests.server_harness import free_port, serving, stream

SECRET = "sk-operator-secret-0123456789"
ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefgh"
ROOT = "root-token-0123456789abcdefg"


def _config(**fields: object) -> AgentConfig:
    return AgentConfig(context=ContextConfig(counter="approx"), **fields)  # type: ignore[arg-type]


def _scripted(config: AgentConfig) -> LLMClient:
    return ScriptedLLM([reply("ok")] * 4)


def _tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    digest = hashlib.sha256(BOB.encode()).hexdigest()
    path.write_text(
        f'[users.alice]\ntoken = "{ALICE}"\n\n[users.bob]\ntoken_sha256 = "{digest}"\n\n'
        f'[users.root]\ntoken = "{ROOT}"\nadmin = true\n'
    )
    return path


def _auth(token: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {token}"}


def _error(response: httpx2.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"code", "message", "field", "run_id"}, body
    assert body["code"] == code, body
    assert body["message"]
    return dict(body)


# -- keys stay home -------------------------------------------------------------------------


async def test_a_client_base_url_is_refused_and_the_key_never_reaches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPERATOR_KEY", SECRET)
    async with OpenAIServer() as operator, OpenAIServer() as attacker:
        operator.script(sse_reply(text_chunks("from the operator")))
        config = _config(
            llm={"model": "m", "base_url": operator.base_url, "api_key_env": "OPERATOR_KEY"}
        )
        async with serving(create_app(config, store=InMemorySessionStore())) as client:
            refused = await client.post("/sessions", json={"base_url": attacker.base_url})
            _error(refused, 422, "client_endpoint_not_allowed")
            refused = await client.post(
                "/sessions", json={"base_url": attacker.base_url, "model": "m"}
            )
            _error(refused, 422, "client_endpoint_not_allowed")
            created = await client.post("/sessions", json={})
            sid = created.json()["id"]
            async with stream(client, f"/sessions/{sid}/events") as events:
                await client.post(f"/sessions/{sid}/messages", json={"message": "hi"})
                await events.until("run_finished")
        assert attacker.requests == []
        assert [r.headers["authorization"] for r in operator.requests] == [f"Bearer {SECRET}"]


async def test_an_allowed_client_endpoint_gets_no_key_nor_the_operators_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPERATOR_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    async with OpenAIServer() as operator, OpenAIServer() as theirs:
        theirs.script(sse_reply(text_chunks("from the client's own server")))
        config = _config(
            llm={
                "model": "m",
                "base_url": operator.base_url,
                "api_key_env": "OPERATOR_KEY",
                "headers": {"X-Operator-Auth": SECRET},
            }
        )
        app = create_app(
            config,
            store=InMemorySessionStore(),
            settings=ServerSettings(allow_client_endpoints=True),
        )
        async with serving(app) as client:
            created = await client.post(
                "/sessions", json={"base_url": theirs.base_url, "model": "their-model"}
            )
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            async with stream(client, f"/sessions/{sid}/events") as events:
                await client.post(f"/sessions/{sid}/messages", json={"message": "hi"})
                frames = await events.until("run_finished")
        assert frames[-1].json["final_text"] == "from the client's own server"
        assert operator.requests == []
        (request,) = theirs.requests
        assert request.body["model"] == "their-model"
        assert SECRET not in json.dumps(dict(request.headers))
        assert request.headers["authorization"] == "Bearer no-key-needed"


async def test_a_session_picks_an_endpoint_by_name_and_a_model_from_its_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPERATOR_KEY", SECRET)
    monkeypatch.setenv("FAST_KEY", "sk-fast-key-987654321")
    async with OpenAIServer() as main, OpenAIServer() as fast:
        fast.script(sse_reply(text_chunks("fast answer")))
        config = _config(
            llm={"model": "m", "base_url": main.base_url, "api_key_env": "OPERATOR_KEY"},
            llms={
                "fast": {
                    "model": "small",
                    "models": ["tiny"],
                    "base_url": fast.base_url,
                    "api_key_env": "FAST_KEY",
                }
            },
        )
        async with serving(create_app(config, store=InMemorySessionStore())) as client:
            listed = (await client.get("/endpoints")).json()
            assert listed == {
                "endpoints": [
                    {"name": "default", "models": ["m"], "default": True},
                    {"name": "fast", "models": ["small", "tiny"], "default": False},
                ],
                "client_endpoints": False,
            }
            assert main.base_url not in json.dumps(listed)
            _error(
                await client.post("/sessions", json={"llm": "fast", "model": "gpt-4o"}),
                422,
                "model_not_allowed",
            )
            _error(await client.post("/sessions", json={"model": "tiny"}), 422, "model_not_allowed")
            _error(await client.post("/sessions", json={"llm": "nope"}), 422, "unknown_llm")
            created = await client.post("/sessions", json={"llm": "fast", "model": "tiny"})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            async with stream(client, f"/sessions/{sid}/events") as events:
                await client.post(f"/sessions/{sid}/messages", json={"message": "hi"})
                await events.until("run_finished")
        assert main.requests == []
        (request,) = fast.requests
        assert request.body["model"] == "tiny"
        assert request.headers["authorization"] == "Bearer sk-fast-key-987654321"


# -- DNS rebinding, origins, forms ------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "attacker.127.0.0.1.nip.io"])
async def test_a_foreign_host_is_refused_on_every_route(host: str) -> None:
    app = create_app(_config(), store=InMemorySessionStore(), llm_factory=_scripted)
    async with serving(app) as client:
        for method, path in (("GET", "/"), ("GET", "/sessions"), ("POST", "/sessions")):
            response = await client.request(
                method, path, headers={"Host": host, "Content-Type": "application/json"}
            )
            _error(response, 421, "unknown_host")


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "[::1]:8000"])
async def test_loopback_names_and_addresses_are_answered(host: str) -> None:
    app = create_app(_config(), store=InMemorySessionStore(), llm_factory=_scripted)
    async with serving(app) as client:
        assert (await client.get("/sessions", headers={"Host": host})).status_code == 200


async def test_a_configured_server_name_is_answered() -> None:
    settings = ServerSettings(server_names=("agents.example.org",))
    app = create_app(
        _config(), store=InMemorySessionStore(), settings=settings, llm_factory=_scripted
    )
    async with serving(app) as client:
        ok = await client.get("/sessions", headers={"Host": "agents.example.org:443"})
        assert ok.status_code == 200
        _error(
            await client.get("/sessions", headers={"Host": "other.example.org"}),
            421,
            "unknown_host",
        )


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "null",
        "http://localhost:1",
        "file://",
        "https://127.0.0.2",
        # No browser sends these; they are refused like any foreign origin, not answered 500.
        "http://127.0.0.1:99999",
        "http://127.0.0.1:-1",
        "http://127.0.0.1:8000.evil.example",
        "http://[::1",
    ],
)
async def test_a_foreign_origin_may_not_change_anything(origin: str) -> None:
    app = create_app(_config(), store=InMemorySessionStore(), llm_factory=_scripted)
    async with serving(app) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        headers = {"Origin": origin, "Content-Type": "application/json"}
        for method, path in (
            ("POST", "/sessions"),
            ("POST", f"/sessions/{sid}/messages"),
            ("POST", f"/sessions/{sid}/cancel"),
            ("POST", f"/sessions/{sid}/resume"),
            ("DELETE", f"/sessions/{sid}"),
        ):
            response = await client.request(method, path, headers=headers, content=b"{}")
            _error(response, 403, "forbidden_origin")
        assert (await client.get(f"/sessions/{sid}")).status_code == 200


async def test_the_servers_own_origin_and_allowed_origins_may() -> None:
    settings = ServerSettings(cors_origins=("https://app.example.org",))
    app = create_app(
        _config(), store=InMemorySessionStore(), settings=settings, llm_factory=_scripted
    )
    async with serving(app) as client:
        own = f"http://127.0.0.1:{client.base_url.port}"
        for origin in (own, "https://app.example.org"):
            response = await client.post("/sessions", json={}, headers={"Origin": origin})
            assert response.status_code == 201, (origin, response.text)


@pytest.mark.parametrize(
    "content_type", [None, "application/x-www-form-urlencoded", "multipart/form-data", "text/plain"]
)
async def test_without_tokens_a_post_a_form_could_send_is_refused(content_type: str | None) -> None:
    app = create_app(_config(), store=InMemorySessionStore(), llm_factory=_scripted)
    async with serving(app) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        headers = {} if content_type is None else {"Content-Type": content_type}
        for path in (f"/sessions/{sid}/cancel", f"/sessions/{sid}/resume", "/sessions"):
            response = await client.post(path, headers=headers, content=b"")
            _error(response, 415, "unsupported_media_type")
        # The same body-less POST as JSON is answered (409: no run to cancel).
        ok = await client.post(
            f"/sessions/{sid}/cancel", headers={"Content-Type": "application/json"}
        )
        _error(ok, 409, "not_running")


async def test_without_tokens_a_form_post_no_route_takes_is_405_with_allow() -> None:
    app = create_app(_config(), store=InMemorySessionStore(), llm_factory=_scripted)
    async with serving(app) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        for path, allowed in ((f"/sessions/{sid}", "DELETE, GET"), ("/endpoints", "GET")):
            response = await client.post(path, headers={"Content-Type": "text/plain"}, content=b"")
            _error(response, 405, "method_not_allowed")
            assert response.headers["allow"] == allowed
        # The session is untouched, and a form POST a route does take is still refused.
        assert (await client.get(f"/sessions/{sid}")).status_code == 200
        refused = await client.post(f"/sessions/{sid}/cancel", content=b"")
        _error(refused, 415, "unsupported_media_type")


# -- tokens and users -----------------------------------------------------------------------


async def test_a_missing_or_wrong_token_is_refused_and_the_scheme_is_case_insensitive(
    tmp_path: Path,
) -> None:
    settings = ServerSettings(tokens_file=_tokens_file(tmp_path))
    app = create_app(
        _config(), store=InMemorySessionStore(), settings=settings, llm_factory=_scripted
    )
    async with serving(app) as client:
        for headers in ({}, _auth("wrong-token"), _auth(ALICE, "Basic"), {"Authorization": ALICE}):
            response = await client.get("/sessions", headers=headers)
            _error(response, 401, "unauthorized")
            assert response.headers["www-authenticate"] == "Bearer"
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert (await client.get("/sessions", headers=_auth(ALICE, scheme))).status_code == 200
        # The inspector's static files load without a token; they hold no data.
        assert (await client.get("/")).status_code == 200


async def test_another_users_session_is_a_404_on_every_route(tmp_path: Path) -> None:
    settings = ServerSettings(tokens_file=_tokens_file(tmp_path))
    app = create_app(
        _config(), store=InMemorySessionStore(), settings=settings, llm_factory=_scripted
    )
    async with serving(app) as client:
        created = await client.post("/sessions", json={}, headers=_auth(ALICE))
        sid = created.json()["id"]
        unknown = "no-such-session"
        routes = [
            ("GET", "/sessions/{}", None),
            ("GET", "/sessions/{}/events?follow=false", None),
            ("GET", "/sessions/{}/approvals", None),
            ("POST", "/sessions/{}/approvals/c1", {"approved": True}),
            ("POST", "/sessions/{}/messages", {"message": "hi"}),
            ("POST", "/sessions/{}/cancel", None),
            ("POST", "/sessions/{}/resume", None),
            ("GET", "/sessions/{}/export", None),
            ("DELETE", "/sessions/{}", None),
        ]
        for method, path, body in routes:
            theirs = await client.request(method, path.format(sid), headers=_auth(BOB), json=body)
            missing = await client.request(
                method, path.format(unknown), headers=_auth(BOB), json=body
            )
            _error(theirs, 404, "not_found")
            _error(missing, 404, "not_found")
            # Another user's session and no session at all are told apart by nothing but id.
            assert theirs.json()["message"].replace(sid, "X") == missing.json()["message"].replace(
                unknown, "X"
            )
        agui = {
            "threadId": sid,
            "runId": "r1",
            "state": {},
            "messages": [{"id": "m1", "role": "user", "content": "hi"}],
            "tools": [],
            "context": [],
            "forwardedProps": {},
        }
        _error(await client.post("/agui", json=agui, headers=_auth(BOB)), 404, "not_found")
        assert (await client.get("/sessions", headers=_auth(BOB))).json()["sessions"] == []
        # Alice and the admin still see it, untouched.
        assert (await client.get(f"/sessions/{sid}", headers=_auth(ALICE))).status_code == 200
        listed = (await client.get("/sessions", headers=_auth(ROOT))).json()["sessions"]
        assert [s["id"] for s in listed] == [sid]


def test_a_tokens_file_of_the_wrong_form_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    for text in (
        "",
        '[users.a]\ntoken = "short"\n',
        '[users.a]\ntoken = "0123456789abcdefXX"\ntoken_sha256 = "00"\n',
        '[users.a]\ntoken_sha256 = "XYZ"\n',
        '[users.a]\ntoken = "0123456789abcdefXX"\n[users.b]\ntoken = "0123456789abcdefXX"\n',
        '[users.a]\ntoken = "0123456789abcdefXX"\nadmin = "yes"\n',
        "[other]\n",
    ):
        path.write_text(text)
        with pytest.raises(ConfigError):
            Users.from_file(path)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(min_size=0, max_size=40), st.sampled_from(["Bearer", "bearer", "Basic", ""]))
def test_only_a_known_token_authenticates(token: str, scheme: str) -> None:
    users = Users.build(token="the-admins-token-0123456789")
    assert users is not None
    header = f"{scheme} {token}".encode("utf-8", "surrogatepass")
    user = users.authenticate(header)
    known = scheme.lower() == "bearer" and token.strip() == "the-admins-token-0123456789"
    assert (user is not None) == known


# -- one error shape --------------------------------------------------------------------------


async def test_framework_refusals_have_the_documented_error_body() -> None:
    app = create_app(_config(), store=InMemorySessionStore(), llm_factory=_scripted)
    async with serving(app) as client:
        _error(await client.get("/no/such/route"), 404, "not_found")
        wrong_method = await client.request(
            "PUT", "/sessions", headers={"Content-Type": "application/json"}
        )
        _error(wrong_method, 405, "method_not_allowed")
        assert set(wrong_method.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
        not_utf8 = await client.post(
            "/sessions",
            content=b'{"title": "\xff\xfe"}',
            headers={"Content-Type": "application/json"},
        )
        assert not_utf8.status_code in (400, 422)
        assert set(not_utf8.json()) == {"code", "message", "field", "run_id"}


# -- audit ----------------------------------------------------------------------------------


async def test_refusals_deletions_and_decisions_are_audited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_flow.server.audit")
    settings = ServerSettings(tokens_file=_tokens_file(tmp_path))
    app = create_app(
        _config(), store=InMemorySessionStore(), settings=settings, llm_factory=_scripted
    )
    async with serving(app) as client:
        sid = (await client.post("/sessions", json={}, headers=_auth(ALICE))).json()["id"]
        await client.get("/sessions", headers=_auth("nope"))
        await client.get(f"/sessions/{sid}", headers=_auth(BOB))
        await client.post(
            f"/sessions/{sid}/approvals/c9", json={"approved": True}, headers=_auth(ALICE)
        )
        await client.delete(f"/sessions/{sid}", headers=_auth(ALICE))
    lines = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "agent_flow.server.audit"
    ]
    actions = [(line["audit"], line.get("code") or line.get("decision") or "") for line in lines]
    assert ("refused", "unauthorized") in actions
    assert ("refused", "not_owner") in actions
    assert ("approval", "not_waiting") in actions
    assert ("deleted", "") in actions
    deleted = next(line for line in lines if line["audit"] == "deleted")
    assert deleted["user"] == "alice" and deleted["session"] == sid


# -- serve makes a token ----------------------------------------------------------------------


def test_serve_makes_a_token_and_prints_the_inspector_address_once(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_FLOW_SERVER_TOKEN")}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_flow.cli",
            "serve",
            "--port",
            str(port),
            "--db",
            str(tmp_path / "s.db"),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line.startswith("agent-flow: warning: no model is configured")  # no --config
        line = process.stderr.readline()
        match = re.search(rf"http://127\.0\.0\.1:{port}/#token=(\S+)", line)
        assert match, line
        token = match.group(1)
        assert f"Bearer {token}" in process.stderr.readline()
        base = f"http://127.0.0.1:{port}"
        with httpx2.Client(base_url=base, timeout=10) as client:
            for _ in range(200):  # bound before the address is printed; served soon after
                try:
                    refused = client.get("/sessions")
                    break
                except httpx2.ConnectError:
                    time.sleep(0.05)
            _error(refused, 401, "unauthorized")
            assert client.get("/sessions", headers=_auth(token)).status_code == 200
            assert client.get("/").status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
        rest = process.stderr.read() if process.stderr is not None else ""
        if process.stderr is not None:
            process.stderr.close()
    assert token not in rest  # shown at start only, never logged again
