"""The NUL character (U+0000): stored whole where a store can, refused where one cannot.

PostgreSQL's text columns take no NUL. The history and events are JSON (where a NUL is the
escape ``\\u0000``), so a message, an answer or a tool result holding one is stored whole by
every store. A session's task and title are its first message copied into plain columns:
there a NUL becomes U+FFFD, on every store alike (before, on PostgreSQL, such a first message
failed the run before anything was stored). A title a client sends with a NUL is refused
with 422 ``invalid_field``.
"""

from __future__ import annotations

import pytest

from agent_flow import AgentExecutor
from agent_flow.sessions import InMemorySessionStore, SessionStore
from agent_flow.testing import FunctionLLM, reply
from tests.store_helpers.fixtures import kind, store

pytest.importorskip("fastapi", reason="the server test needs the 'server' extra")

from agent_flow.config import AgentConfig
from agent_flow.server import create_app
from tests.server_harness import serving

__all__ = ["kind", "store"]  # fixtures


async def test_a_first_message_with_a_nul_is_stored_whole_on_every_store(
    store: SessionStore,
) -> None:
    agent = AgentExecutor(FunctionLLM(lambda request: reply("got\x00it"), model="m"), store=store)
    outcome = await agent.run("hi\x00there")
    assert outcome.stop_reason.value == "answered"
    assert agent.session_id is not None
    stored = await store.load(agent.session_id)
    assert [entry.content for entry in stored.entries] == ["hi\x00there", "got\x00it"]  # type: ignore[union-attr]
    assert stored.info.task == "hi\ufffdthere"
    assert stored.info.title == "hi\ufffdthere"
    assert stored.info.status == "completed"


async def test_a_title_with_a_nul_is_refused_with_invalid_field() -> None:
    app = create_app(
        AgentConfig(),
        store=InMemorySessionStore(),
        llm_factory=lambda config: FunctionLLM(lambda request: reply("ok"), model="m"),
    )
    async with serving(app) as client:
        refused = await client.post("/sessions", json={"title": "plan\u0000b"})
        made = await client.post("/sessions", json={"title": "plan b"})
    assert refused.status_code == 422
    assert refused.json()["code"] == "invalid_field"
    assert refused.json()["field"] == "title"
    assert "NUL" in refused.json()["message"]
    assert made.status_code == 201
