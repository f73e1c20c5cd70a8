"""AG-UI inputs a client should not send, on a real uvicorn: refused whole, or taken whole.

A lone UTF-16 surrogate anywhere in a run input (JSON may escape one: ``"\\ud800"``) is a 422
``invalid_field`` naming where it is, and the input writes nothing: before, a seeded message
holding one failed that run and every later run of the session, and one in ``context`` was a
500 after the client's state and messages had been written. A NUL in a new thread's first
message (which names the session) runs, as it does through ``POST /sessions/{id}/messages``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.llm.base import LLMClient
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, reply
from tests.server_harness import serving

CONFIG = AgentConfig(context=ContextConfig(counter="approx"))
LONE = "\ud800"


def _scripted(config: AgentConfig) -> LLMClient:
    return ScriptedLLM([reply("ok")] * 40)


def _call(call_id: str, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": arguments}}


def _body(thread: str, text: str = "go", **changes: Any) -> dict[str, Any]:
    """A new thread's input whose earlier messages seed its history."""
    body: dict[str, Any] = {
        "threadId": thread,
        "runId": "r",
        "state": None,
        "messages": [
            {"id": "1", "role": "user", "content": "hi"},
            {"id": "2", "role": "assistant", "content": "sure", "toolCalls": [_call("c1")]},
            {"id": "3", "role": "tool", "toolCallId": "c1", "content": "done"},
            {"id": "4", "role": "assistant", "content": "what next?"},
            {"id": "5", "role": "user", "content": text},
        ],
        "tools": [],
        "context": [{"description": "page", "value": "home"}],
        "forwardedProps": {},
    }
    body.update(changes)
    return body


def _poisoned(where: str) -> tuple[dict[str, Any], str]:
    """An input holding a lone surrogate at `where`, and the field the refusal names."""
    body = _body(f"t-{where}")
    messages = body["messages"]
    if where == "assistant":
        messages[1]["content"] = f"a{LONE}b"
        return body, "messages.1.content"
    if where == "arguments":
        messages[1]["toolCalls"] = [_call("c1", json.dumps({"x": LONE}, ensure_ascii=False))]
        return body, "messages.1.toolCalls.0.function.arguments"
    if where == "result":
        messages[2]["content"] = LONE
        return body, "messages.2.content"
    if where == "context":
        body["context"] = [{"description": "page", "value": f"x{LONE}"}]
        return body, "context.0.value"
    if where == "state":
        body["state"] = {"knowledge": {"extra": {LONE: 1}}}
        return body, "state.knowledge.extra.\ufffd"  # said as U+FFFD: an answer is UTF-8
    assert where == "props"
    body["forwardedProps"] = {"note": [LONE]}
    return body, "forwardedProps.note.0"


async def _post(client: httpx2.AsyncClient, body: dict[str, Any]) -> httpx2.Response:
    # json.dumps escapes the lone surrogate ("\ud800"), as a browser's JSON.stringify does.
    return await client.post(
        "/agui", content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )


async def _finishes(client: httpx2.AsyncClient, body: dict[str, Any]) -> str:
    async with client.stream("POST", "/agui", json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        text = "".join([chunk async for chunk in answer.aiter_text()])
    assert '"type":"RUN_FINISHED"' in text and "RUN_ERROR" not in text, text
    return text


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(where=st.sampled_from(["assistant", "arguments", "result", "context", "state", "props"]))
async def test_a_lone_surrogate_anywhere_is_refused_and_the_thread_runs_after(where: str) -> None:
    store = InMemorySessionStore()
    app = create_app(CONFIG, store=store, llm_factory=_scripted)
    async with serving(app) as client:
        body, field = _poisoned(where)
        thread = body["threadId"]
        refused = await _post(client, body)
        assert refused.status_code == 422, refused.text
        error = refused.json()
        assert error["code"] == "invalid_field" and error["field"] == field
        assert "lone UTF-16 surrogate" in error["message"]
        # Nothing was written: no session, or (another try) one the refusal left as it was.
        assert (await client.get(f"/sessions/{thread}")).status_code == 404
        await _finishes(client, _body(thread))
        view = (await client.get(f"/sessions/{thread}")).json()
        assert view["environment"]["knowledge"]["extra"]["client_context"] == [
            {"description": "page", "value": "home"}
        ]
        before = view["history"]["entries"]
        again = await _post(client, {**body, "messages": [*_body(thread)["messages"][-1:]]})
        if where in ("context", "state", "props"):  # the rest of the input is for this run
            assert again.status_code == 422 and again.json()["field"] == field
            after = (await client.get(f"/sessions/{thread}")).json()
            assert after["history"]["entries"] == before
            assert after["environment"] == view["environment"]
        # The thread is not poisoned: a plain message runs, through either route.
        sent = await client.post(f"/sessions/{thread}/messages", json={"message": "more"})
        assert sent.status_code == 202, sent.text


async def test_a_nul_in_a_new_threads_first_message_runs_and_names_the_session() -> None:
    store = InMemorySessionStore()
    app = create_app(CONFIG, store=store, llm_factory=_scripted)
    async with serving(app) as client:
        body = {
            "threadId": "nul-thread",
            "runId": "r1",
            "state": None,
            "messages": [{"id": "1", "role": "user", "content": "hi\u0000there"}],
            "tools": [],
            "context": [],
            "forwardedProps": {},
        }
        await _finishes(client, body)
        view = (await client.get("/sessions/nul-thread")).json()
        assert view["title"] == "hi\ufffdthere"
