"""The service when its session store races or fails: the documented error, never a 500.

Two processes may create the same session id at once (the second learns it exists only when
its insert is refused), and a PostgreSQL store may be down or restarting. Both are answered
with an `ErrorBody`: 409 ``session_exists``, 503 ``store_unavailable``, on a real uvicorn.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.errors import SessionExistsError, StoreError
from agent_flow.llm.base import LLMClient
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore, SessionInfo, SQLiteSessionStore
from agent_flow.testing import ScriptedLLM, reply
from tests.private_postgres import PrivatePostgres
from tests.server_harness import serving

pytestmark = pytest.mark.timeout(120)


def _config() -> AgentConfig:
    return AgentConfig(context=ContextConfig(counter="approx"))


def _scripted(config: AgentConfig) -> LLMClient:
    return ScriptedLLM([reply("ok")] * 4)


class _CreatedMeanwhile(SQLiteSessionStore):
    """A store where another process creates each session named by id just before this one."""

    async def create(self, *, session_id: str | None = None, **fields: Any) -> SessionInfo:
        if session_id is not None:
            with contextlib.suppress(SessionExistsError):
                await super().create(session_id=session_id, agent="agent", title="theirs")
        return await super().create(session_id=session_id, **fields)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_every_store_refuses_a_second_session_under_one_id_with_its_own_error(
    store: str, tmp_path: Path
) -> None:
    sessions = InMemorySessionStore() if store == "memory" else SQLiteSessionStore(tmp_path / "s")
    await sessions.create(session_id="s1", agent="agent")
    with pytest.raises(SessionExistsError, match="'s1' is already stored") as raised:
        await sessions.create(session_id="s1", agent="agent")
    assert isinstance(raised.value, StoreError)  # what callers caught before it had a name
    await sessions.aclose()


async def test_a_session_created_meanwhile_elsewhere_is_409_session_exists(tmp_path: Path) -> None:
    store = _CreatedMeanwhile(tmp_path / "sessions.db")
    app = create_app(_config(), store=store, llm_factory=_scripted)
    async with serving(app) as client:
        response = await client.post("/sessions", json={"session_id": "raced"})
        assert response.status_code == 409, response.text
        assert response.json() == {
            "code": "session_exists",
            "message": "session 'raced' exists; choose another id or omit it",
            "field": "session_id",
            "run_id": None,
        }
        # An AG-UI thread's first input races the same way: it runs in the session made.
        body = {
            "threadId": "thread-raced",
            "runId": "r1",
            "state": None,
            "messages": [{"id": "m1", "role": "user", "content": "hello"}],
            "tools": [],
            "context": [],
            "forwardedProps": {},
        }
        async with client.stream("POST", "/agui", json=body) as answer:
            assert answer.status_code == 200
            text = "".join([chunk async for chunk in answer.aiter_text()])
        assert '"type":"RUN_FINISHED"' in text and "RUN_ERROR" not in text
    await store.aclose()


async def test_a_store_that_is_down_is_503_store_unavailable_then_works_again(
    private_cluster: PrivatePostgres, caplog: pytest.LogCaptureFixture
) -> None:
    from agent_flow.sessions import PostgresSessionStore

    store = PostgresSessionStore(private_cluster.url(), connect_timeout=2)
    app = create_app(_config(), store=store, llm_factory=_scripted)
    async with serving(app) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        private_cluster.stop()
        for method, path, payload in (
            ("POST", f"/sessions/{sid}/messages", {"message": "hello"}),
            ("POST", "/sessions", {}),
            ("GET", "/sessions", None),
        ):
            started = time.monotonic()
            response = await client.request(method, path, json=payload)
            waited = time.monotonic() - started
            assert response.status_code == 503, (path, response.text)
            body: dict[str, Any] = response.json()
            assert body["code"] == "store_unavailable" and body["field"] is None
            # The cause (hosts, ports, databases) is for the log, not for the client.
            assert str(private_cluster.port) not in json.dumps(body)
            assert waited < 30, f"{path} waited {waited:.1f} s for the pool"
        assert any("the session store failed" in r.getMessage() for r in caplog.records)
        private_cluster.start()
        deadline = time.monotonic() + 30
        while True:
            sent = await client.post(f"/sessions/{sid}/messages", json={"message": "again"})
            if sent.status_code == 202 or time.monotonic() > deadline:
                break
            assert sent.status_code == 503, sent.text
        assert sent.status_code == 202, sent.text
    await store.aclose()
