"""The AG-UI endpoint's stream: every event validates against the official types, the state
deltas applied to the snapshot (with an independent RFC 6902 implementation) give the server's
environment exactly, and no agent event is told twice (only unmapped kinds go as CUSTOM)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
import jsonpatch
from ag_ui.core import Event, EventType
from pydantic import TypeAdapter

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import Environment
from agent_flow.events import EVENT_KINDS
from agent_flow.server import create_app
from agent_flow.server._agui import MAPPING, UNMAPPED, AgUiRun
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import ToolContext, ToolExecutor, tool
from tests.server_harness import BodyWrites, frames, serving

EVENT = TypeAdapter(Event)
CONFIG = AgentConfig(context=ContextConfig(counter="approx"))


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


def _input(
    thread: str,
    run: str,
    text: str | None = None,
    *,
    messages: list[Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """A run input as a JSON body (camelCase, as clients send it)."""
    body: dict[str, Any] = {
        "threadId": thread,
        "runId": run,
        "state": {},
        "messages": messages
        if messages is not None
        else [{"id": f"m-{run}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    body.update(more)
    return body


async def _run(client: httpx2.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a run input; every event it streams, each checked against the AG-UI types."""
    got: list[dict[str, Any]] = []
    async with client.stream("POST", "/agui", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for frame in frames(response):
            payload = json.loads(frame.data)
            EVENT.validate_python(payload)  # every event is a valid AG-UI event
            got.append(payload)
    return got


def _replay(events: list[dict[str, Any]], state: Any = None) -> Any:
    for event in events:
        if event["type"] == EventType.STATE_SNAPSHOT.value:
            state = event["snapshot"]
        elif event["type"] == EventType.STATE_DELTA.value:
            state = jsonpatch.apply_patch(state, event["delta"])
    return state


async def _server_state(client: httpx2.AsyncClient, thread: str) -> dict[str, Any]:
    """The session's environment as the AG-UI state holds it: its sections and version."""
    view = (await client.get(f"/sessions/{thread}")).json()
    return {**view["environment"], "version": view["environment_version"]}


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
    app = create_app(CONFIG, store=store, llm_factory=lambda config: model, tools_factory=_tools)
    async with serving(app) as client:
        first = await _run(client, _input("thread-1", "r1", "take notes"))
        types = [event["type"] for event in first]
        assert types[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"] and types[-1] == "RUN_FINISHED"
        assert first[0]["threadId"] == "thread-1" and first[0]["runId"] == "r1"
        assert "STATE_DELTA" in types and "TOOL_CALL_RESULT" in types
        assert "TEXT_MESSAGE_CONTENT" in types
        text = "".join(e["delta"] for e in first if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "planningnoted it"
        server_state = await _server_state(client, "thread-1")
        assert _replay(first) == server_state
        assert server_state["extensions"]["notes"]["first"] == {"text": "1", "tags": ["z", "b"]}
        assert server_state["task"]["plan"][0]["description"] == "note"
        # A second run on the thread continues the same session from a fresh snapshot.
        second = await _run(client, _input("thread-1", "r2", "one more"))
        assert _replay(second) == await _server_state(client, "thread-1")
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
    events = run.state.events()
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
        for event in run.state.events():
            kinds.append(event.type)
            wire = json.loads(event.model_dump_json(by_alias=True))
            replica = jsonpatch.apply_patch(replica, wire["delta"])
        assert replica == {**json.loads(env.to_json())["state"], "version": env.version}
    assert kinds == [EventType.STATE_DELTA] * 3


def test_every_agent_event_kind_is_mapped_or_sent_as_custom_and_never_both() -> None:
    assert set(MAPPING) | UNMAPPED == EVENT_KINDS, "a new event kind needs a decision here"
    assert not set(MAPPING) & UNMAPPED


async def test_an_eight_call_run_sends_each_event_once_and_only_unmapped_kinds_as_custom() -> None:
    # Eight model calls, seven of them calling a tool with streamed arguments.
    script = [
        reply(f"step {i}", tool_calls=[call("note", key=f"k{i}", value="v" * 40, call_id=f"n{i}")])
        for i in range(7)
    ]
    model = ScriptedLLM([*script, reply("all noted")], chunk_size=4)
    store = InMemorySessionStore()
    app = create_app(CONFIG, store=store, llm_factory=lambda config: model, tools_factory=_tools)
    async with serving(app) as client:
        events = await _run(client, _input("eight", "r1", "take eight notes"))
        stored = await store.events("eight")
    assert len(model.requests) == 8
    kinds = Counter(event.kind for event in stored)
    assert kinds["tool_call_arguments_delta"] > 7, "the model streamed the arguments"
    custom = Counter(e["name"] for e in events if e["type"] == "CUSTOM")
    # Exactly the unmapped kinds, each as often as the run published it, and nothing else.
    assert custom == Counter({kind: n for kind, n in kinds.items() if kind in UNMAPPED})
    assert set(custom) <= UNMAPPED and "tool_call_arguments_delta" not in custom
    types = Counter(e["type"] for e in events)
    assert types["TOOL_CALL_ARGS"] == types["TOOL_CALL_START"] == types["TOOL_CALL_RESULT"] == 7
    assert types["STEP_STARTED"] == types["STEP_FINISHED"] == 8
    args = [json.loads(e["delta"]) for e in events if e["type"] == "TOOL_CALL_ARGS"]
    assert args[0] == {"key": "k0", "value": "v" * 40}, "the arguments come once, whole"
    assert types["CUSTOM"] < 40, f"{types['CUSTOM']} CUSTOM events for an 8-call run"


async def test_reasoning_and_an_answer_the_model_did_not_stream_reach_the_client() -> None:
    model = ScriptedLLM(
        [
            reply(
                "",
                thinking="weighing it",
                tool_calls=[call("task_completion", summary="all done", call_id="t1")],
            )
        ]
    )
    app = create_app(CONFIG, store=InMemorySessionStore(), llm_factory=lambda config: model)
    async with serving(app) as client:
        events = await _run(client, _input("think", "r1", "do it"))
    types = [e["type"] for e in events]
    start = types.index("REASONING_START")
    assert types[start : start + 2] == ["REASONING_START", "REASONING_MESSAGE_START"]
    assert "REASONING_END" in types[start:]
    thought = "".join(e["delta"] for e in events if e["type"] == "REASONING_MESSAGE_CONTENT")
    assert thought == "weighing it"
    said = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert said == "all done"
    assert types.index("TEXT_MESSAGE_END") < types.index("RUN_FINISHED")
    assert events[-1]["result"]["stop_reason"] == "completed"


async def test_a_failed_run_ends_with_run_error() -> None:
    model = ScriptedLLM([])  # no answer at all: the model call fails
    app = create_app(CONFIG, store=InMemorySessionStore(), llm_factory=lambda config: model)
    async with serving(app) as client:
        events = await _run(client, _input("broken", "r1", "hello"))
    assert events[-1]["type"] == "RUN_ERROR"
    assert "RUN_FINISHED" not in [e["type"] for e in events]


async def test_a_delegated_childs_lifecycle_and_approval_reach_the_agui_client() -> None:
    from agent_flow import Delegate
    from agent_flow.tools import ToolPolicy

    wrote: list[str] = []

    @tool(policy=ToolPolicy(requires_approval=True))
    def publish(text: str) -> str:
        """Publish a text.

        Args:
            text: What to publish.
        """
        wrote.append(text)
        return "published"

    child = Delegate(
        "writer",
        "Write and publish.",
        llm=ScriptedLLM(
            [
                reply(
                    "child thinks aloud", tool_calls=[call("publish", text="hi", call_id="c-pub")]
                ),
                "child done",
            ]
        ),
        tools=[publish],
    )

    def tools(config: AgentConfig) -> ToolExecutor:
        executor = _tools(config)
        executor.register(child)
        return executor

    parent = ScriptedLLM([reply(tool_calls=[call("writer", task="publish hi")]), "parent done"])
    app = create_app(
        CONFIG, store=InMemorySessionStore(), llm_factory=lambda c: parent, tools_factory=tools
    )
    got: list[dict[str, Any]] = []
    async with serving(app) as client:
        body = _input("thread-d", "r1", "go")
        async with client.stream("POST", "/agui", json=body) as response:
            assert response.status_code == 200
            async for frame in frames(response):
                payload = json.loads(frame.data)
                EVENT.validate_python(payload)
                got.append(payload)
                value = payload.get("value") or {}
                if payload.get("name") == "delegated" and value.get("kind") == "approval_required":
                    answer = await client.post(
                        "/sessions/thread-d/approvals/c-pub", json={"approved": True}
                    )
                    assert answer.status_code == 204, answer.text
    delegated = [e["value"] for e in got if e.get("name") == "delegated"]
    kinds = [v["kind"] for v in delegated]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert "approval_required" in kinds and "tool_call_completed" in kinds
    assert all(v["path"] == [v["path"][0]] for v in delegated)  # one level: the run's child
    assert wrote == ["hi"]
    # The child's text is not the run's: only the parent's answer is a text message.
    text = "".join(e["delta"] for e in got if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "parent done"
    assert got[-1]["type"] == "RUN_FINISHED"


async def test_events_queued_together_go_out_in_one_write() -> None:
    # A tool call alone is three AG-UI events; what the stream finds queued is one write.
    script = [reply("", tool_calls=[call("note", key=f"k{i}", value="v")]) for i in range(4)]
    model = ScriptedLLM([*script, reply("done")])
    app = create_app(
        CONFIG,
        store=InMemorySessionStore(),
        llm_factory=lambda config: model,
        tools_factory=_tools,
    )
    writes = BodyWrites(app, "/agui")
    async with serving(writes) as client:
        events = await _run(client, _input("batched", "r1", "take notes"))
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    assert Counter(e["type"] for e in events)["TOOL_CALL_RESULT"] == 4
    assert writes.count < len(events) / 2, f"{writes.count} writes for {len(events)} events"
