"""The client's AG-UI state (agent_flow/server/_agui_state.py): written when it is based on the
environment's current version, all or nothing; otherwise not applied, and the client is told."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.environment import Environment, TaskStatus
from agent_flow.server import create_app
from agent_flow.server._agui_state import (
    SECTIONS,
    agui_state,
    apply_client_state,
    plan_client_state,
)
from agent_flow.server._errors import ApiError
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, call, reply
from tests.server_harness import serving, stream
from tests.test_server_agui import CONFIG, _input, _replay, _run, _server_state, _tools

_KEYS = st.text(alphabet="abcxyz_/~", min_size=1, max_size=4)
_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2), st.text(max_size=3)
)
_JSON = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=8,
)


def _sections(env: Environment) -> dict[str, Any]:
    state = agui_state(env)
    return {section: state[section] for section in SECTIONS}


@st.composite
def _environments(draw: st.DrawFn) -> Environment:
    env = Environment()
    for key, value in draw(st.dictionaries(_KEYS, _JSON, max_size=4)).items():
        env.set(f"/extensions/{key.replace('~', '~0').replace('/', '~1')}", value)
    for fact in draw(st.lists(st.text(max_size=5), max_size=3)):
        env.set("/knowledge/discovered_facts/-", fact)
    return env


@st.composite
def _edits(draw: st.DrawFn, server: dict[str, Any]) -> dict[str, Any]:
    """What a client may send: the sections it holds, some changed, some left out."""
    client = copy.deepcopy(server)
    if draw(st.booleans()):
        client["extensions"] = draw(st.dictionaries(_KEYS, _JSON, max_size=4))
    elif client["extensions"] and draw(st.booleans()):
        client["extensions"].pop(sorted(client["extensions"])[0])
    if draw(st.booleans()):
        client["knowledge"]["discovered_facts"] = draw(st.lists(st.text(max_size=5), max_size=3))
    if draw(st.booleans()):
        client["task"]["status"] = draw(st.sampled_from([s.value for s in TaskStatus]))
    for section in draw(st.lists(st.sampled_from(SECTIONS), max_size=2, unique=True)):
        del client[section]
    return client


@settings(max_examples=150)
@given(data=st.data(), env=_environments(), offset=st.integers(-3, 3))
def test_a_state_based_on_the_current_version_is_written_exactly_and_any_other_is_not(
    data: st.DataObject, env: Environment, offset: int
) -> None:
    server = _sections(env)
    client = data.draw(_edits(server))
    version = env.version + offset
    client["version"] = version
    plan = plan_client_state(server, env.version, client)
    before = env.version
    apply_client_state(env, plan)
    after = _sections(env)
    if version != before:
        # Behind (or ahead): nothing written, and the plan says why.
        assert not plan.applied and not plan.writes and plan.client_version == version
        assert after == server and env.version == before
        assert str(version) in plan.reason and str(before) in plan.reason
        return
    assert plan.applied
    for section in SECTIONS:
        expected = client.get(section, server[section])
        assert json.dumps(after[section], sort_keys=True) == json.dumps(expected, sort_keys=True)
    # One recorded change per write, and none for what the client left as it was.
    assert env.version == before + len(plan.writes)
    untouched = {s: v for s, v in client.items() if s != "version"}
    assert plan_client_state(after, env.version, {**untouched, "version": env.version}).writes == ()


@settings(max_examples=60)
@given(env=_environments(), status=st.text(min_size=1, max_size=8))
def test_a_state_the_environment_refuses_writes_nothing_at_all(
    env: Environment, status: str
) -> None:
    server = _sections(env)
    client = {**copy.deepcopy(server), "version": env.version}
    client["extensions"]["fresh"] = 1  # a good write before the bad one
    client["task"]["status"] = status
    plan = plan_client_state(server, env.version, client)
    before, version = env.to_json(), env.version
    if status in {s.value for s in TaskStatus}:
        apply_client_state(env, plan)
        assert env.get("/extensions/fresh") == 1
        return
    with pytest.raises(ApiError) as refused:
        apply_client_state(env, plan)
    assert refused.value.status == 422 and refused.value.code == "invalid_state"
    assert refused.value.field == "state" and "/task/status" in refused.value.message
    assert env.to_json() == before and env.version == version


@pytest.mark.parametrize(
    ("state", "applied"),
    [
        (None, True),
        ({}, True),
        ({"extensions": {"a": 1}}, True),  # no version: based on version 0, a new thread's
        ({"version": 0, "extensions": {"a": 1}}, True),
        ({"version": 1, "extensions": {"a": 1}}, False),
    ],
)
def test_no_state_or_an_initial_state_fits_a_new_environment(
    state: dict[str, Any] | None, applied: bool
) -> None:
    env = Environment()
    plan = plan_client_state(_sections(env), env.version, state)
    assert plan.applied is applied
    apply_client_state(env, plan)
    assert env.has("/extensions/a") is (applied and bool(state) and "extensions" in state)


@pytest.mark.parametrize(
    "state",
    [[1], {"version": "3"}, {"version": True}, {"version": 0, "memory": {}}],
)
def test_a_state_that_is_not_the_environments_shape_is_a_422(state: Any) -> None:
    env = Environment()
    with pytest.raises(ApiError) as refused:
        plan_client_state(_sections(env), env.version, state)
    assert refused.value.status == 422 and refused.value.field == "state"


# -- over HTTP ------------------------------------------------------------------------------


async def test_over_http_a_current_state_is_written_a_stale_one_is_not_and_a_bad_one_is_422() -> (
    None
):
    model = ScriptedLLM(
        [
            reply(tool_calls=[call("note", key="a", value="1", call_id="n1")]),
            reply("first"),
            reply("second"),
            reply("from the other client"),
            reply("third"),
        ]
    )
    store = InMemorySessionStore()
    app = create_app(CONFIG, store=store, llm_factory=lambda config: model, tools_factory=_tools)
    async with serving(app) as client:
        first = await _run(client, _input("t", "r1", "start"))
        held = _replay(first)
        assert held == await _server_state(client, "t")
        # Current: the client's change is written before the run, and the run starts from it.
        mine = copy.deepcopy(held)
        mine["extensions"]["prefs"] = {"color": "blue"}
        second = await _run(client, _input("t", "r2", "go on", state=mine))
        assert second[1]["snapshot"]["extensions"]["prefs"] == {"color": "blue"}
        assert "state_not_applied" not in [e.get("name") for e in second]
        held = _replay(second)
        assert held == await _server_state(client, "t")
        # Another client moves the session on: this one is behind now.
        last = (await store.events_with_ids("t", after_id=-1))[-1][0]
        async with stream(client, "/sessions/t/events", after=last) as events:
            sent = await client.post("/sessions/t/messages", json={"message": "elsewhere"})
            assert sent.status_code == 202
            await events.until("run_finished")
        stale = copy.deepcopy(held)
        stale["extensions"]["prefs"] = {"color": "red"}
        third = await _run(client, _input("t", "r3", "and now", state=stale))
        notice = next(e for e in third if e.get("name") == "state_not_applied")
        assert notice["value"]["client_version"] == held["version"]
        assert notice["value"]["server_version"] > held["version"]
        assert third[1]["snapshot"]["extensions"]["prefs"] == {"color": "blue"}
        assert third[-1]["result"]["final_text"] == "third"
        assert _replay(third) == await _server_state(client, "t")
        # Refused by the environment: 422, nothing written, no run.
        bad = copy.deepcopy(_replay(third))
        bad["task"]["status"] = "bogus"
        bad["extensions"]["prefs"] = {"color": "green"}
        before = await _server_state(client, "t")
        events_before = len(await store.events("t"))
        refused = await client.post("/agui", json=_input("t", "r4", "x", state=bad))
        assert refused.status_code == 422
        assert refused.json()["code"] == "invalid_state" and refused.json()["field"] == "state"
        assert await _server_state(client, "t") == before
        assert len(await store.events("t")) == events_before
        assert (await client.get("/sessions/t")).json()["state"] == "idle"


async def test_a_new_threads_initial_state_without_a_version_is_written() -> None:
    app = create_app(
        CONFIG, store=InMemorySessionStore(), llm_factory=lambda config: ScriptedLLM(["hi"])
    )
    async with serving(app) as client:
        events = await _run(
            client, _input("fresh", "r1", "hello", state={"extensions": {"theme": "dark"}})
        )
        assert events[1]["snapshot"]["extensions"] == {"theme": "dark"}
        assert "state_not_applied" not in [e.get("name") for e in events]
        assert (await _server_state(client, "fresh"))["extensions"] == {"theme": "dark"}
