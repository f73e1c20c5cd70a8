"""Delegated child runs are stored with the parent's session: one run, one tree, one sequence.

A child's events (``path`` set) are numbered in the top-level run's sequence, recorded by the
parent's recorder and saved with its steps, so every store keeps them with ids, the session's
usage totals count the children's calls, SSE watchers get ids for them, and ``replay``,
``sessions diff`` and the lab read them.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Delegate
from agent_flow.cli import main
from agent_flow.events import AgentEvent, RunStarted
from agent_flow.lab import session_from_state
from agent_flow.llm.base import LLMRequest
from agent_flow.sessions import InMemorySessionStore, SessionStore, SQLiteSessionStore
from agent_flow.sessions.diff import diff_sessions
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM, call, reply
from tests.store_helpers.fixtures import kind, store

__all__ = ["kind", "store"]  # fixtures

APPROX = ContextConfig(max_tokens=8000, counter="approx")


def delegating(*tasks: str) -> FunctionLLM:
    """A parent model: delegates `tasks` in one step, then answers with what came back."""

    def play(request: LLMRequest) -> Reply:
        if request.messages[-1].role == "tool":
            results = [m.content for m in request.messages if m.role == "tool"]
            return reply("parent done: " + " | ".join(str(r) for r in results))
        return reply(tool_calls=[call("investigate", task=t) for t in tasks])

    return FunctionLLM(play, model="parent")


def child_llm() -> FunctionLLM:
    """A child model that makes one model call per task and answers with the task."""
    return FunctionLLM(lambda r: reply(f"found: {r.messages[-1].content}"), model="child")


def storing_agent(sessions: SessionStore, *tasks: str, nested: bool = False) -> AgentExecutor:
    tools: list[Any] = []
    if nested:
        dig = Delegate("dig", "Dig.", llm=ScriptedLLM(["bedrock"] * 8))
        tools.append(dig)
        llm: Any = FunctionLLM(
            lambda r: (
                reply("child saw " + str(r.messages[-1].content))
                if r.messages[-1].role == "tool"
                else reply(tool_calls=[call("dig", task="deeper")])
            )
        )
    else:
        llm = child_llm()
    child = Delegate("investigate", "Investigate.", llm=llm, tools=tools)
    agent = AgentExecutor(delegating(*tasks), config=AgentConfig(context=APPROX), store=sessions)
    child.add_to(agent)
    return agent


async def cli(argv: list[str]) -> tuple[int, str]:
    """Run the real CLI in a thread (it runs its own event loop); its exit code and stdout."""
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(main, argv, stdout=out, stderr=err)
    return code, out.getvalue() + err.getvalue()


def tree_of(events: list[AgentEvent], run_id: str) -> list[AgentEvent]:
    return [e for e in events if e.run_id == run_id or e.path[:1] == (run_id,)]


async def test_child_runs_are_stored_with_the_parent_session_in_its_sequence(
    store: SessionStore,
) -> None:
    agent = storing_agent(store, "one", "two")
    outcome = await agent.run("go")
    session_id = agent.session_id
    assert session_id is not None
    pairs = await store.events_with_ids(session_id)
    events = [event for _, event in pairs]
    children = [e for e in events if isinstance(e, RunStarted) and e.path]
    assert [c.task for c in sorted(children, key=lambda c: c.task)] == ["one", "two"]
    assert all(c.path == (outcome.run_id,) for c in children)
    # One sequence for the tree, gap-free; ids strictly increasing, as stored.
    assert [e.seq for e in tree_of(events, outcome.run_id)] == list(range(len(events)))
    ids = [i for i, _ in pairs]
    assert ids == sorted(set(ids))
    # The stored totals count the children's calls, as the outcome does.
    info = await store.info(session_id)
    assert info.model_calls == len(outcome.usage_per_call) == 4  # 2 parent, 2 children
    assert info.prompt_tokens == outcome.usage.prompt_tokens


async def test_a_later_run_of_the_session_stores_its_tree_above_the_first(tmp_path: Path) -> None:
    async with SQLiteSessionStore(tmp_path / "s.db") as db_store:
        agent = storing_agent(db_store, "one", nested=True)
        first = await agent.run("go")
        session_id = agent.session_id
        assert session_id is not None
        second = AgentExecutor(
            delegating("two"),
            config=AgentConfig(context=APPROX),
            store=db_store,
            session_id=session_id,
        )
        Delegate("investigate", "I.", llm=child_llm()).add_to(second)
        later = await second.run("again")
        pairs = await db_store.events_with_ids(session_id)
    events = [event for _, event in pairs]
    grandchildren = [e for e in events if len(e.path) == 2]
    assert grandchildren and all(e.path[0] == first.run_id for e in grandchildren)
    assert any(e.path == (later.run_id,) for e in events)
    ids = [i for i, _ in pairs]
    assert ids == sorted(set(ids))
    for run in (first.run_id, later.run_id):
        tree = tree_of(events, run)
        assert [e.seq for e in tree] == list(range(len(tree)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4))
async def test_any_number_of_parallel_children_take_one_gap_free_sequence(tasks: list[str]) -> None:
    memory = InMemorySessionStore()
    agent = storing_agent(memory, *tasks)
    outcome = await agent.run("go")
    assert agent.session_id is not None
    events = await memory.events(agent.session_id)
    assert [e.seq for e in events] == list(range(len(events)))
    started = [e for e in events if isinstance(e, RunStarted) and e.path]
    assert len(started) == len(tasks)
    for child in started:  # each child's events: after its start, in order, ending once
        own = [e for e in events if e.run_id == child.run_id]
        assert own[0].kind == "run_started" and own[-1].kind == "run_finished"
        assert [e.kind for e in own].count("run_finished") == 1
    assert outcome.stop_reason.value == "answered"


async def test_sessions_diff_counts_children_apart_and_marks_their_prompts(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSessionStore(db) as db_store:
        a = storing_agent(db_store, "one")
        await a.run("go")
        b = AgentExecutor(delegating("one"), config=AgentConfig(context=APPROX), store=db_store)
        await b.run("go")  # no delegate registered: the call fails, no child runs
        assert a.session_id is not None and b.session_id is not None
        a_state, a_events = await db_store.load(a.session_id), await db_store.events(a.session_id)
        b_state, b_events = await db_store.load(b.session_id), await db_store.events(b.session_id)
    diff = diff_sessions(a_state, a_events, b_state, b_events)
    assert (diff.a.runs, diff.a.child_runs, diff.b.child_runs) == (1, 1, 0)
    assert diff.a.stop_reasons == ("answered",)
    assert [s.a.depth for s in diff.steps if s.a is not None] == [0, 1, 0]
    code, text = await cli(["sessions", "diff", a.session_id, b.session_id, "--db", str(db)])
    assert code == 0, text
    assert "1 run(s) (+1 delegated)" in text
    assert any(line.lstrip().startswith(">2") for line in text.splitlines()), text


async def test_the_lab_replays_the_top_level_run_and_each_delegated_run(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSessionStore(db) as db_store:
        agent = storing_agent(db_store, "one", "two")
        outcome = await agent.run("go")
        assert agent.session_id is not None
        state = await db_store.load(agent.session_id)
        events = await db_store.events(agent.session_id)
    recorded = session_from_state(state, events)
    assert len(recorded.steps) == 2  # the parent's two model calls, not the children's
    assert recorded.final_answer == outcome.final_text
    assert sorted(c.title for c in recorded.delegated) == ["one", "two"]
    for child in recorded.delegated:
        assert child.id.startswith(f"{agent.session_id}/")
        assert len(child.steps) == 1 and child.steps[0].environment is None
        assert child.final_answer == f"found: {child.title}"
    argv = ["lab", agent.session_id, "--db", str(db), "--budget", "4000", "--json"]
    code, text = await cli([*argv, "--strategy", "drop_oldest", "--delegated"])
    assert code == 0, text
    replayed = json.dumps(json.loads(text))
    assert all(child.id in replayed for child in recorded.delegated), text
    code, text = await cli([*argv, "--strategy", "drop_oldest"])
    assert code == 0 and not any(child.id in text for child in recorded.delegated)


async def test_replay_shows_the_children_nested_under_the_parent(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSessionStore(db) as db_store:
        agent = storing_agent(db_store, "one")
        await agent.run("go")
        assert agent.session_id is not None
    code, text = await cli(["replay", agent.session_id, "--db", str(db), "--speed", "0"])
    assert code == 0, text
    assert "delegated run" in text and "found: one" in text, text


async def test_sse_watchers_get_ids_for_child_events_the_same_as_stored() -> None:
    pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")
    from agent_flow.server import create_app
    from agent_flow.tools import ToolExecutor
    from tests.server_harness import serving, stream

    memory = InMemorySessionStore()

    def tools(config: AgentConfig) -> ToolExecutor:
        executor = ToolExecutor()
        executor.register(Delegate("investigate", "Investigate.", llm=child_llm()))
        return executor

    app = create_app(
        AgentConfig(context=APPROX),
        store=memory,
        llm_factory=lambda config: delegating("one", "two"),
        tools_factory=tools,
    )
    async with serving(app) as client:
        sid = (await client.post("/sessions", json={})).json()["id"]
        async with stream(client, f"/sessions/{sid}/events", policy="wait") as reading:
            sent = await client.post(f"/sessions/{sid}/messages", json={"message": "go"})
            assert sent.status_code == 202, sent.text
            frames = []
            while True:  # the top-level run's end, not a child's
                frame = await reading.next()
                frames.append(frame)
                if frame.event == "run_finished" and "path" not in json.loads(frame.data):
                    break
    children = [f for f in frames if f.data and "path" in json.loads(f.data)]
    assert len([f for f in children if f.event == "run_started"]) == 2
    assert all(f.id is not None for f in frames if f.event != "comment")
    stored = {i: e.run_id for i, e in await memory.events_with_ids(sid)}
    for frame in frames:
        if frame.id is not None:
            assert stored[int(frame.id)] == json.loads(frame.data)["run_id"]


async def test_sessions_show_lists_delegated_runs_under_their_parent(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSessionStore(db) as db_store:
        agent = storing_agent(db_store, "one", nested=True)
        await agent.run("go")
        assert agent.session_id is not None
    code, text = await cli(["sessions", "show", agent.session_id, "--db", str(db)])
    assert code == 0, text
    assert "runs (1, 2 delegated)" in text, text
    lines = text.splitlines()
    child = next(line for line in lines if "↳" in line and "one" in line)
    grandchild = next(line for line in lines if "↳" in line and "deeper" in line)
    assert child.index("↳") < grandchild.index("↳")  # indented one level more
