"""The AG-UI endpoint: every event validates against the official types, and the state deltas
applied to the snapshot (with an independent RFC 6902 implementation) give the server's
environment exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import jsonpatch
from ag_ui.core import Event, EventType
from pydantic import TypeAdapter

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import Environment
from agent_flow.server import create_app
from agent_flow.server._agui import AgUiRun
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import ToolContext, ToolExecutor, tool
from tests.server_harness import frames, serving

EVENT = TypeAdapter(Event)


@tool
def note(key: str, value: str, context: ToolContext) -> str:
    """Write notes into the environment, deep and in lists.

    Args:
        key: Where.
        value: What.
        context: Supplied by the executor.
    """
    env = context.environment
    assert env is not None
    env.set(f"/extensions/notes/{key}/text", value)
    env.set(f"/extensions/notes/{key}/tags", ["a"])
    env.set(f"/extensions/notes/{key}/tags/-", "b")
    env.set(f"/extensions/notes/{key}/tags/0", "z")
    env.set("/knowledge/discovered_facts/-", f"{key}={value}")
    if env.has("/extensions/notes/old"):
        env.delete("/extensions/notes/old")
    return "noted"


def _tools(config: AgentConfig) -> ToolExecutor:
    executor = ToolExecutor()
    executor.register(note)
    return executor


def _input(thread: str, run: str, text: str) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": run,
        "state": {},
        "messages": [{"id": f"m-{run}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }


async def _run(client: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    async with client.stream("POST", "/agui", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for frame in frames(response):
            payload = json.loads(frame.data)
            EVENT.validate_python(payload)  # every event is a valid AG-UI event
            got.append(payload)
    return got


def _replay(events: list[dict[str, Any]]) -> Any:
    state: Any = None
    for event in events:
        if event["type"] == EventType.STATE_SNAPSHOT.value:
            state = event["snapshot"]
        elif event["type"] == EventType.STATE_DELTA.value:
            state = jsonpatch.apply_patch(state, event["delta"])
    return state


async def test_deltas_applied_to_the_snapshot_reproduce_the_environment() -> None:
    model = ScriptedLLM(
        [
            reply(
                "planning",
                tool_calls=[
                    call(
                        "update_plan",
                        steps=[{"description": "note"}, {"description": "finish"}],
                        call_id="p1",
                    ),
                    call("note", key="first", value="1", call_id="n1"),
                ],
            ),
            reply("noted it"),
            reply(tool_calls=[call("note", key="second", value="2", call_id="n2")]),
            reply("second done"),
        ]
    )
    store = InMemorySessionStore()
    app = create_app(
        AgentConfig(context=ContextConfig(counter="approx")),
        store=store,
        llm_factory=lambda config: model,
        tools_factory=_tools,
    )
    async with serving(app) as client:
        first = await _run(client, _input("thread-1", "r1", "take notes"))
        types = [event["type"] for event in first]
        assert types[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"] and types[-1] == "RUN_FINISHED"
        assert first[0]["threadId"] == "thread-1" and first[0]["runId"] == "r1"
        assert "STATE_DELTA" in types and "TOOL_CALL_RESULT" in types
        assert "TEXT_MESSAGE_CONTENT" in types
        text = "".join(e["delta"] for e in first if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "planningnoted it"
        server_state = (await client.get("/sessions/thread-1")).json()["environment"]
        assert _replay(first) == server_state
        assert server_state["extensions"]["notes"]["first"] == {"text": "1", "tags": ["z", "b"]}
        # A second run on the thread continues the same session from a fresh snapshot.
        second = await _run(client, _input("thread-1", "r2", "one more"))
        server_state = (await client.get("/sessions/thread-1")).json()["environment"]
        assert _replay(second) == server_state
        assert second[-1]["result"]["final_text"] == "second done"
        bad = await client.post("/agui", json=_input("../x", "r3", "hi"))
        assert bad.status_code == 422 and bad.json()["field"] == "threadId"
        empty = await client.post("/agui", json={**_input("thread-2", "r3", "x"), "messages": []})
        assert empty.status_code == 422 and empty.json()["field"] == "messages"


def test_a_trimmed_change_log_or_odd_writes_resend_a_snapshot_that_still_matches() -> None:
    env = Environment(max_changes=2)
    run = AgUiRun("t", "r", env)
    replica = run.opening()[1].snapshot
    for index in range(5):
        env.set(f"/extensions/k{index}", index)
    events = run.state_events()
    assert [event.type for event in events] == [EventType.STATE_SNAPSHOT]
    replica = events[0].snapshot
    kinds = []
    for first, second in [
        (lambda: env.set("/extensions/list", [1, 2]), lambda: env.set("/extensions/list/-", 3)),
        (lambda: env.delete("/extensions/list/0"), lambda: env.delete("/extensions/k0")),
        (lambda: env.set("/extensions/a/b/c", 1), lambda: env.set("/extensions/list/0", 9)),
    ]:
        first()
        second()
        for event in run.state_events():
            kinds.append(event.type)
            wire = json.loads(event.model_dump_json(by_alias=True))
            replica = jsonpatch.apply_patch(replica, wire["delta"])
        assert replica == json.loads(env.to_json())["state"]
    assert kinds == [EventType.STATE_DELTA] * 3
