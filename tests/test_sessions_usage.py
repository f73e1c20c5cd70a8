"""A session's usage and cost totals: upgrading old stores in place, and what the CLI shows.

The totals' contract (sum over the stored calls, unknown price → unknown cost) is in
tests/test_store_conformance.py. Here: SQLite files and PostgreSQL schemas written by the
previous agent_flow (tests/data, see tests/data/make_old_stores.py) gain their totals, summed
from the events they already hold, and keep working; and ``agent-flow sessions list/show``.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from agent_flow.agent import AgentExecutor
from agent_flow.cli import main
from agent_flow.config import AgentConfig, ContextConfig, Pricing
from agent_flow.environment import Environment
from agent_flow.history import History
from agent_flow.sessions import (
    Checkpoint,
    PostgresSessionStore,
    SessionStore,
    SQLiteSessionStore,
)
from agent_flow.sessions import postgres as postgres_module
from agent_flow.sessions import sqlite as sqlite_module
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.postgres import URL, drop_schema, require_postgres
from tests.store_helpers.usage import expected_totals, step_events

DATA = Path(__file__).resolve().parent / "data"

#: What the old stores hold (tests/data/make_old_stores.py): calls per session, in order.
OLD_TOTALS = {
    "priced": {
        "model_calls": 3,
        "prompt_tokens": 303,
        "completion_tokens": 33,
        "cost_usd": 0.0 + 0.0012 + 0.0003 + 0.1,
        "unpriced_calls": 0,
        "estimated_calls": 0,
    },
    "unpriced": {
        "model_calls": 3,
        "prompt_tokens": 303,
        "completion_tokens": 33,
        "cost_usd": None,
        "unpriced_calls": 1,
        "estimated_calls": 0,
    },
    "idle": {
        "model_calls": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
        "unpriced_calls": 0,
        "estimated_calls": 0,
    },
}


async def _check_upgraded(store: SessionStore) -> None:
    """The old sessions show their totals, read back whole, and go on counting."""
    for session_id, totals in OLD_TOTALS.items():
        info = await store.info(session_id)
        assert info.model_dump(include=set(totals)) == totals
        assert expected_totals(await store.events(session_id)) == totals
        assert info.task == f"task {session_id}"
    state = await store.load("priced")
    assert len(state.entries) == 6 and state.environment is not None
    history = History(state.entries, counter=ApproxCounter())
    environment: Environment = state.environment
    events = step_events([(1000, 100, 0.5, "agent", True)], "run-new")
    after = await store.save_step("priced", history=history, environment=environment, events=events)
    assert after.model_calls == 4 and after.estimated_calls == 1
    assert after.cost_usd == OLD_TOTALS["priced"]["cost_usd"] + 0.5  # type: ignore[operator]
    assert after == await store.info("priced")
    # The checkpoints table came with the migrations too.
    marks = [Checkpoint("run-new", 0, "model_call", "{}")]
    await store.save_checkpoints("priced", marks)
    assert await store.checkpoints("priced", "run-new") == marks


async def test_a_schema_2_sqlite_file_gains_its_totals_in_place(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    shutil.copy(DATA / "sessions_v2.db", path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (2,)
    raw.close()
    async with SQLiteSessionStore(path) as store:
        await _check_upgraded(store)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (sqlite_module.SCHEMA_VERSION,)
        assert raw.execute("SELECT cost_usd FROM sessions WHERE id = 'unpriced'").fetchone() == (
            None,
        )
    raw.close()
    async with SQLiteSessionStore(path) as store:  # reopening migrates nothing more
        assert (await store.info("unpriced")).unpriced_calls == 1


@pytest.fixture
def pg_schema() -> Iterator[str]:
    require_postgres()
    schema = f"af_test_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        drop_schema(schema)


async def test_a_schema_1_postgres_store_gains_its_totals_in_place(pg_schema: str) -> None:
    dump = (DATA / "postgres_v1.sql").read_text().replace("__SCHEMA__", pg_schema)
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(dump.encode())
        found = conn.execute(
            sql.SQL("SELECT version FROM {}.agent_flow_schema").format(sql.Identifier(pg_schema))
        ).fetchone()
    assert found == (1,)
    async with PostgresSessionStore(URL, schema=pg_schema) as store:
        await _check_upgraded(store)
    with psycopg.connect(URL, autocommit=True) as conn:
        found = conn.execute(
            sql.SQL("SELECT version FROM {}.agent_flow_schema").format(sql.Identifier(pg_schema))
        ).fetchone()
    assert found == (postgres_module.SCHEMA_VERSION,)


# -- the CLI ----------------------------------------------------------------------------------


def _cli(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdin=io.StringIO(""), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


async def test_sessions_list_and_show_give_each_sessions_tokens_and_cost(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    shutil.copy(DATA / "sessions_v2.db", db)
    pricing = Pricing(input_per_million=2.0, output_per_million=8.0)
    async with SQLiteSessionStore(db) as store:
        agent = AgentExecutor(
            ScriptedLLM(
                [
                    reply(
                        "Looking.", tool_calls=[call("update_plan", steps=[{"description": "a"}])]
                    ),
                    reply(tool_calls=[call("task_completion", summary="Done.")]),
                    reply(tool_calls=[call("task_completion", summary="Done again.")]),
                ]
            ),
            config=AgentConfig(context=ContextConfig(max_tokens=8000), pricing=pricing),
            store=store,
        )
        first = await agent.run("count the files")
        second = await agent.run("count them again")
        assert agent.session_id is not None
        info = await store.info(agent.session_id)
    assert first.cost_usd is not None and second.cost_usd is not None
    usage = first.usage + second.usage
    assert (info.model_calls, info.prompt_tokens, info.completion_tokens) == (
        3,
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert info.cost_usd == pytest.approx(first.cost_usd + second.cost_usd, rel=1e-12)

    listing = await asyncio.to_thread(_cli, "sessions", "list", "--db", str(db))
    header, *rows, _footer = listing.splitlines()
    assert header.split()[4:6] == ["TOKENS", "COST"]
    cells = {row.split()[0]: row.split() for row in rows}
    assert cells["priced"][5:7] == ["336", "$0.10"]
    assert cells["unpriced"][5:7] == ["336", "unknown"]
    assert cells["idle"][5:7] == ["0", "$0.00"]
    total = usage.prompt_tokens + usage.completion_tokens
    assert cells[agent.session_id][5] == f"{total:,}"

    show = await asyncio.to_thread(_cli, "sessions", "show", "unpriced", "--db", str(db))
    assert (
        "  usage:    3 model call(s), 303 prompt + 33 completion tokens, cost unknown "
        "(1 call(s) with no known price)\n"
    ) in show
    show = await asyncio.to_thread(_cli, "sessions", "show", agent.session_id, "--db", str(db))
    assert f"3 model call(s), {usage.prompt_tokens:,} prompt + " in show
    assert f"completion tokens, ${info.cost_usd:.6f}".rstrip("0") in show


# -- export and import ------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["older", "edited"])
async def test_an_import_recomputes_the_totals_from_its_events(tmp_path: Path, header: str) -> None:
    path = tmp_path / "sessions.db"
    shutil.copy(DATA / "sessions_v2.db", path)
    async with SQLiteSessionStore(path) as store:
        stream = io.StringIO()
        await store.export("unpriced", stream)
        first, *rest = stream.getvalue().splitlines()
        line = json.loads(first)
        for name in OLD_TOTALS["unpriced"]:
            if header == "older":  # as an export written before sessions kept totals
                del line["session"][name]
            else:
                line["session"][name] = 7
        text = "\n".join([json.dumps(line), *rest]) + "\n"
        imported = await store.import_(io.StringIO(text), session_id="again")
    totals = OLD_TOTALS["unpriced"]
    assert imported.model_dump(include=set(totals)) == totals
