"""`agent-flow replay` and `agent-flow sessions diff`, on sessions a scripted agent recorded."""

from __future__ import annotations

import asyncio
import io
import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import jsonpointer
import pytest
from hypothesis import given

from agent_flow._types import JsonValue
from agent_flow.agent import AgentExecutor
from agent_flow.cli._replay import replay_events
from agent_flow.cli.render import EventRenderer, make_console
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.events import AgentEvent, event_to_json
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.sessions.diff import diff_environments
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.testing.strategies import json_values
from tests.helpers import add
from tests.test_cli import Captured, invoke

PLAN_A = [{"description": "count"}]
PLAN_B = [{"description": "count", "completed": True}, {"description": "report"}]


async def record(db: Path, *, plan: list[dict[str, JsonValue]], adds: bool, budget: int) -> str:
    """Run a scripted agent into the store at `db`; return the session's id."""
    steps = [reply("Planning.", tool_calls=[call("update_plan", steps=plan)])]
    if adds:
        steps.append(reply("Adding.", tool_calls=[call("add", a=20, b=22)]))
    steps.append(reply(tool_calls=[call("task_completion", summary="There are 3 files.")]))
    async with SQLiteSessionStore(db) as store:
        agent = AgentExecutor(
            ScriptedLLM(steps),
            config=AgentConfig(context=ContextConfig(max_tokens=budget, counter="approx")),
            store=store,
        )
        agent.tools.register(add)
        await agent.run("count the files")
        assert agent.session_id is not None
        return agent.session_id


async def record_with_trace(db: Path) -> tuple[str, str]:
    """Record a session while rendering it live, as `agent-flow run --trace` does."""
    live = io.StringIO()
    renderer = EventRenderer(make_console(live))
    steps = [
        reply("Planning.", thinking="Plan first.", tool_calls=[call("update_plan", steps=PLAN_A)]),
        reply("Adding.", tool_calls=[call("add", a=20, b=22), call("add", a=1, b=2)]),
        reply(tool_calls=[call("task_completion", summary="42 and 3.")]),
    ]
    async with SQLiteSessionStore(db) as store:
        agent = AgentExecutor(
            ScriptedLLM(steps),
            config=AgentConfig(context=ContextConfig(max_tokens=8000, counter="approx")),
            store=store,
        )
        agent.tools.register(add)
        agent.events.on(None, renderer)
        await agent.run("add the numbers")
        assert agent.session_id is not None
        return agent.session_id, live.getvalue()


async def run_cli(argv: list[str]) -> Captured:
    return await asyncio.to_thread(invoke, argv)


# -- replay ----------------------------------------------------------------------------------


async def test_a_replay_renders_exactly_what_the_live_run_showed(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session_id, live = await record_with_trace(db)
    replayed = await run_cli(["replay", session_id, "--db", str(db), "--speed", "0"])
    assert replayed.code == 0, replayed.err
    assert replayed.out == live
    assert "▸ add" in live and "✓ task_completion" in live and "Plan first." in live
    assert f"replaying session {session_id} (completed):" in replayed.err
    assert "at once" in replayed.err

    exported = tmp_path / "export.jsonl"
    done = await run_cli(["sessions", "export", session_id, "--db", str(db), "-o", str(exported)])
    assert done.code == 0
    from_file = await run_cli(["replay", str(exported), "--speed", "0"])
    assert from_file.code == 0, from_file.err
    assert from_file.out == live
    assert f"replaying {exported} (completed)" in from_file.err


async def test_a_json_replay_writes_the_stored_events_as_lines(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session_id = await record(db, plan=PLAN_A, adds=False, budget=8000)
    async with SQLiteSessionStore(db) as store:
        events = await store.events(session_id)
    replayed = await run_cli(["replay", session_id, "--db", str(db), "--speed", "0", "--json"])
    assert replayed.code == 0, replayed.err
    assert replayed.out.splitlines() == [event_to_json(e) for e in events]


def spaced(events: list[AgentEvent], gaps: list[float]) -> list[AgentEvent]:
    """The events with timestamps `gaps` seconds apart (the rest 0 apart)."""
    start = events[0].timestamp
    out, offset = [], 0.0
    for index, event in enumerate(events):
        if 0 < index <= len(gaps):
            offset += gaps[index - 1]
        out.append(event.model_copy(update={"timestamp": start + timedelta(seconds=offset)}))
    return out


async def test_pauses_follow_the_recorded_gaps_scaled_by_speed_and_capped(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session_id = await record(db, plan=PLAN_A, adds=False, budget=8000)
    async with SQLiteSessionStore(db) as store:
        events = spaced(await store.events(session_id), [0.2, 3.0, 10.0, -1.0])
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    rendered: list[AgentEvent] = []
    waited = await replay_events(events, rendered.append, speed=2, max_wait=4, sleep=sleep)
    # A clock that went backwards (-1 s) is no pause; zero gaps are none either.
    assert pauses == pytest.approx([0.1, 1.5, 4.0])
    assert waited == pytest.approx(5.6)
    assert rendered == events
    pauses.clear()
    await replay_events(events, rendered.append, speed=0, max_wait=4, sleep=sleep)
    assert pauses == []


async def test_the_command_waits_as_the_recording_did(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session_id = await record(db, plan=PLAN_A, adds=False, budget=8000)
    exported = tmp_path / "export.jsonl"
    export = ["sessions", "export", session_id, "--db", str(db), "-o", str(exported)]
    assert (await run_cli(export)).code == 0
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    events = [item["event"] for item in lines if item["kind"] == "event"]
    # Stretch the recording to 1.2 s: the second event 0.6 s after the first, the last 0.6 s
    # after the one before it.
    start = datetime.fromisoformat(events[0]["timestamp"])
    for index, event in enumerate(events):
        offset = 0.0 if index == 0 else (0.6 if index < len(events) - 1 else 1.2)
        event["timestamp"] = (start + timedelta(seconds=offset)).isoformat()
    exported.write_text("".join(json.dumps(item) + "\n" for item in lines))

    began = time.monotonic()
    replayed = await run_cli(["replay", str(exported), "--speed", "2"])
    elapsed = time.monotonic() - began
    assert replayed.code == 0, replayed.err
    assert "recorded over 1.2 s, at 2x" in replayed.err
    assert elapsed >= 0.6


async def test_replay_refuses_what_it_cannot_read_with_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    await record(db, plan=PLAN_A, adds=False, budget=8000)
    unknown = await run_cli(["replay", "nosuchsession", "--db", str(db)])
    assert unknown.code == 2 and "nosuchsession" in unknown.err
    folder = await run_cli(["replay", str(tmp_path), "--db", str(db)])
    assert folder.code == 2 and "is a directory" in folder.err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"kind": "entry"}\n')
    refused = await run_cli(["replay", str(broken)])
    assert refused.code == 2 and "is not a session export" in refused.err
    assert refused.err.count("\n") == 1
    negative = await run_cli(["replay", "x", "--speed", "-1"])  # argparse writes to sys.stderr
    assert negative.code == 2 and "must be 0 (no pauses) or more" in capsys.readouterr().err


# -- sessions diff ---------------------------------------------------------------------------


async def test_diff_shows_environment_changes_and_prompt_budgets_step_by_step(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    a = await record(db, plan=PLAN_A, adds=False, budget=8000)
    b = await record(db, plan=PLAN_B, adds=True, budget=4000)

    shown = await run_cli(["sessions", "diff", a, b, "--db", str(db)])
    assert shown.code == 0, shown.err
    out = shown.out
    assert f"A  session {a} (completed): 1 run(s) [completed], 2 prompt(s)" in out
    assert f"B  session {b} (completed): 1 run(s) [completed], 3 prompt(s)" in out
    assert "  + /task/plan/1: " in out and '"report"' in out
    assert "  ~ /task/plan/0/completed: false -> true" in out
    assert "  ~ /task/steps_total: 1 -> 2" in out
    assert '  + /extensions/tool_results: {"add": {"call_id": ' in out
    assert "  ~ /task/objective" not in out  # the same task
    table = out.split("prompts step by step", 1)[1].splitlines()[1:]
    assert table[0].split() == [
        "STEP", "A", "TOTAL", "ENV", "HIST", "OMITTED", "B", "TOTAL", "ENV", "HIST", "OMITTED",
        "B-A",
    ]  # fmt: skip
    step1, step2, step3 = (row.split() for row in table[1:4])
    assert step1[0] == "1" and step1[1] == step1[5]  # the same first prompt
    assert step1[-1] == "+0"
    assert step3[:5] == ["3", "-", "-", "-", "-"] and step3[-1] == "-"
    assert int(step2[-1]) == int(step2[5]) - int(step2[1])
    assert table[4].startswith("tokens sent: A ")

    as_json = await run_cli(["sessions", "diff", a, b, "--db", str(db), "--json"])
    data = json.loads(as_json.out)
    assert data["a"]["prompts"] == 2 and data["b"]["prompts"] == 3
    assert data["steps"][0]["a"]["breakdown"]["budget"] == 8000
    assert data["steps"][0]["b"]["breakdown"]["budget"] == 4000
    changes = {c["pointer"]: c for c in data["environment"]}
    assert changes["/task/steps_total"] == {
        "pointer": "/task/steps_total",
        "op": "changed",
        "a": 1,
        "b": 2,
    }


async def test_diff_reads_exports_and_finds_a_session_equal_to_its_export(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    a = await record(db, plan=PLAN_A, adds=False, budget=8000)
    b = await record(db, plan=PLAN_B, adds=True, budget=4000)
    files = []
    for session_id in (a, b):
        path = tmp_path / f"{session_id}.jsonl"
        await run_cli(["sessions", "export", session_id, "--db", str(db), "-o", str(path)])
        files.append(str(path))

    same = await run_cli(["sessions", "diff", a, files[0], "--db", str(db)])
    assert same.code == 0, same.err
    assert "environment: the same in A and B" in same.out
    assert "B-A +0 (+0.0%)" in same.out
    from_files = await run_cli(["sessions", "diff", *files])
    from_store = await run_cli(["sessions", "diff", a, b, "--db", str(db)])
    assert from_files.out.split("\n", 2)[2] == from_store.out.split("\n", 2)[2]


# -- the comparison of two environments ------------------------------------------------------


def canonical(value: JsonValue) -> str:
    """JSON text that tells values apart as JSON does (1 from 1.0 and true; not 0.0 from -0.0)."""

    def plain(item: JsonValue) -> JsonValue:
        if isinstance(item, dict):
            return {k: plain(v) for k, v in item.items()}
        if isinstance(item, list):
            return [plain(v) for v in item]
        return item + 0.0 if isinstance(item, float) else item

    return json.dumps(plain(value), sort_keys=True)


@given(a=json_values(), b=json_values())
def test_every_difference_names_a_pointer_that_holds_those_values(
    a: JsonValue, b: JsonValue
) -> None:
    assert diff_environments(a, a) == []
    changes = diff_environments(a, b)
    assert (changes == []) == (canonical(a) == canonical(b))
    missing = object()
    for change in changes:
        in_a = jsonpointer.resolve_pointer(a, change.pointer, missing)
        in_b = jsonpointer.resolve_pointer(b, change.pointer, missing)
        if change.op == "added":
            assert in_a is missing and in_b == change.b
        elif change.op == "removed":
            assert in_b is missing and in_a == change.a
        else:
            assert (in_a, in_b) == (change.a, change.b)


@given(a=json_values(), b=json_values())
def test_the_differences_are_the_same_read_from_either_side(a: JsonValue, b: JsonValue) -> None:
    swap = {"added": "removed", "removed": "added", "changed": "changed"}
    forward = {(c.pointer, c.op) for c in diff_environments(a, b)}
    backward = {(c.pointer, swap[c.op]) for c in diff_environments(b, a)}
    assert forward == backward


def test_an_empty_array_to_a_full_one_lists_each_new_item() -> None:
    changes = diff_environments({"facts": []}, {"facts": ["a", "b"]})
    assert [(c.pointer, c.op, c.b) for c in changes] == [
        ("/facts/0", "added", "a"),
        ("/facts/1", "added", "b"),
    ]
    escaped = diff_environments({"a/b~": 1}, {"a/b~": 1.0})
    assert [(c.pointer, c.op) for c in escaped] == [("/a~1b~0", "changed")]


def test_the_readme_commands_for_replay_and_diff_parse() -> None:
    from agent_flow.cli import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### Replaying and comparing sessions", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].split()[1:] for line in block.strip().splitlines()]
    assert [c[0] for c in commands] == ["replay", "replay", "sessions"]
    for argv in commands:
        args = build_parser().parse_args(argv)
        assert args.handler.__name__ in ("_replay_command", "_sessions_diff")
