"""What is particular to `PostgresSessionStore` and to choosing a store by URL.

The shared contract is tested in tests/test_store_conformance.py; here: migrations, refusals,
errors that name the server without its password, and `open_store`.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.rows import dict_row

import agent_flow.sessions._pg_schema as schema_module
import agent_flow.sessions.postgres as postgres_module
from agent_flow.agent import AgentExecutor
from agent_flow.cli import main
from agent_flow.config import (
    AgentConfig,
    ContextConfig,
    StoreConfig,
    load_config,
    load_store_config,
)
from agent_flow.environment import Environment
from agent_flow.errors import ConfigError, StoreError, UserError
from agent_flow.history import History
from agent_flow.sessions import (
    InMemorySessionStore,
    PostgresSessionStore,
    SQLiteSessionStore,
    open_store,
)
from agent_flow.sessions.postgres import redact
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tokens import ApproxCounter
from tests.openai_server import OpenAIServer, sse_reply, text_chunks
from tests.store_helpers.postgres import URL, drop_schema, require_postgres
from tests.store_helpers.session_writer import add_step

ROOT = str(Path(__file__).resolve().parent.parent)


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema name no other test uses; the schema is dropped after the test."""
    require_postgres()
    schema = f"af_test_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        drop_schema(schema)


def _raw(schema: str, statement: str) -> list[tuple[object, ...]]:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        cur = conn.execute(statement.encode())
        return cur.fetchall() if cur.description else []


async def test_a_new_schema_is_created_at_the_current_version(pg_schema: str) -> None:
    async with PostgresSessionStore(URL, schema=pg_schema) as store:
        await store.create(session_id="s")
    assert _raw(pg_schema, "SELECT version FROM agent_flow_schema") == [
        (postgres_module.SCHEMA_VERSION,)
    ]


async def test_a_schema_newer_than_this_agent_flow_is_refused(pg_schema: str) -> None:
    async with PostgresSessionStore(URL, schema=pg_schema) as store:
        await store.create(session_id="s")
    _raw(pg_schema, "UPDATE agent_flow_schema SET version = 99")
    with pytest.raises(StoreError, match="schema version 99, newer than"):
        async with PostgresSessionStore(URL, schema=pg_schema):
            pass


async def test_a_sessions_table_of_another_application_is_refused(pg_schema: str) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
    _raw(pg_schema, "CREATE TABLE sessions (id INTEGER)")
    with pytest.raises(StoreError, match="not an agent_flow session store"):
        async with PostgresSessionStore(URL, schema=pg_schema):
            pass


async def test_an_appended_migration_runs_once_when_processes_open_together(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with PostgresSessionStore(URL, schema=pg_schema) as store:
        info = await store.create(session_id="old")
    runs: list[int] = []

    async def add_pinned(conn: schema_module._Conn) -> None:
        runs.append(1)
        await conn.execute("ALTER TABLE sessions ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT false")

    # The migrations run from the schema module (`_pg_schema.migrate`).
    monkeypatch.setattr(schema_module, "MIGRATIONS", (*schema_module.MIGRATIONS, add_pinned))
    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", schema_module.SCHEMA_VERSION + 1)
    stores = [PostgresSessionStore(URL, schema=pg_schema) for _ in range(3)]
    try:
        await asyncio.gather(*(store.__aenter__() for store in stores))
        assert (await stores[0].info("old")) == info
    finally:
        for store in stores:
            await store.aclose()
    assert runs == [1]
    assert _raw(
        pg_schema, "SELECT version, (SELECT pinned FROM sessions) FROM agent_flow_schema"
    ) == [(schema_module.SCHEMA_VERSION, False)]


def test_processes_opening_a_fresh_schema_together_all_start_on_one_schema(
    pg_schema: str,
) -> None:
    # Each process creates the schema if missing and migrates it, under one advisory lock.
    code = (
        "import asyncio, sys\n"
        "from agent_flow.sessions import PostgresSessionStore\n"
        "async def main():\n"
        "    async with PostgresSessionStore(sys.argv[1], schema=sys.argv[2]) as store:\n"
        "        await store.create()\n"
        "asyncio.run(main())\n"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", code, URL, pg_schema], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    errors = [process.communicate()[1].decode() for process in processes]
    assert [process.returncode for process in processes] == [0] * 4, errors
    assert _raw(pg_schema, "SELECT count(*) FROM sessions") == [(4,)]
    assert _raw(pg_schema, "SELECT version FROM agent_flow_schema") == [
        (postgres_module.SCHEMA_VERSION,)
    ]


async def test_an_unreachable_server_is_a_store_error_without_the_password() -> None:
    store = PostgresSessionStore(
        "postgresql://someone:s3cret@127.0.0.1:1/nowhere", connect_timeout=1
    )
    with pytest.raises(StoreError, match=r"someone:\*\*\*@127\.0\.0\.1:1") as caught:
        await store.list()
    assert "s3cret" not in str(caught.value)
    await store.aclose()
    assert "s3cret" not in repr(store)


def test_redact_hides_only_the_password() -> None:
    assert redact("postgresql://u:pw@h:5/db?x=1") == "postgresql://u:***@h:5/db?x=1"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


async def test_open_store_chooses_the_store_from_a_path_or_url(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), InMemorySessionStore)
    sqlite_store = open_store(tmp_path / "a.db")
    assert isinstance(sqlite_store, SQLiteSessionStore)
    assert sqlite_store.path == tmp_path / "a.db"
    by_url = open_store(f"sqlite://{tmp_path / 'b.db'}")
    assert isinstance(by_url, SQLiteSessionStore)
    assert by_url.path == tmp_path / "b.db"
    pg = open_store("postgres://u@h/db?schema=agents&sslmode=disable")
    assert isinstance(pg, PostgresSessionStore)
    assert (pg.url, pg.schema) == ("postgres://u@h/db?sslmode=disable", "agents")
    with pytest.raises(ConfigError, match=r"mysql://\.\.\. is of no known kind"):
        open_store("mysql://u@h/db")
    with pytest.raises(UserError, match="not a PostgreSQL URL"):
        PostgresSessionStore("http://h/db")
    for store in (sqlite_store, by_url, pg):
        await store.aclose()


async def test_a_session_written_through_one_url_is_read_through_another_store(
    pg_schema: str,
) -> None:
    history, environment = add_step_fresh()
    async with open_store(f"{URL}?schema={pg_schema}") as writer:
        info = await writer.create()
        await writer.save_step(info.id, history=history, environment=environment)
    async with PostgresSessionStore(URL, schema=pg_schema) as reader:
        assert (await reader.load(info.id)).entries == tuple(history.entries)


def add_step_fresh() -> tuple[History, Environment]:
    history, environment = History(counter=ApproxCounter()), Environment()
    add_step(history, environment, 0)
    return history, environment


def test_the_embedded_default_imports_neither_psycopg_nor_dbos(tmp_path: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "import agent_flow\n"
        "from agent_flow.sessions import open_store\n"
        "async def main():\n"
        f"    async with open_store({str(tmp_path / 's.db')!r}) as store:\n"
        "        await store.create()\n"
        "asyncio.run(main())\n"
        "loaded = [m for m in ('psycopg', 'psycopg_pool', 'dbos') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- selecting the store by configuration ------------------------------------------------------


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


async def test_the_sessions_commands_take_a_postgresql_url_or_a_config_store_url(
    pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "home"))
    url = f"{URL}?schema={pg_schema}"
    llm = ScriptedLLM([reply(tool_calls=[call("task_completion", summary="done")])])
    async with open_store(url) as store:
        agent = AgentExecutor(
            llm, config=AgentConfig(context=ContextConfig(max_tokens=8000)), store=store
        )
        await agent.run("count the files")
        session_id = agent.session_id
    assert session_id is not None
    code, out, _ = await asyncio.to_thread(_cli, ["sessions", "list", "--db", url])
    assert code == 0
    assert session_id in out and "completed" in out
    assert out.splitlines()[-1] == f"1 session(s) in {url}"
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nname = "x"\n\n[store]\nurl = "{url}"\n')
    code, out, _ = await asyncio.to_thread(
        _cli, ["sessions", "show", session_id, "--config", str(config)]
    )
    assert code == 0 and f"session {session_id}  (completed)" in out
    # --db wins over the config file; the default stays the SQLite file.
    code, out, _ = await asyncio.to_thread(
        _cli, ["sessions", "list", "--config", str(config), "--db", str(tmp_path / "s.db")]
    )
    assert (code, out) == (0, f"no sessions in {tmp_path / 's.db'}\n")
    code, out, _ = await asyncio.to_thread(_cli, ["sessions", "list"])
    assert (code, out) == (0, f"no sessions in {tmp_path / 'home' / 'sessions.db'}\n")


def test_a_store_url_of_no_known_kind_is_a_usage_error() -> None:
    code, _, err = _cli(["sessions", "list", "--db", "mysql://u@h/db"])
    assert code == 2 and "mysql://... is of no known kind" in err


def test_the_store_table_is_read_and_checked(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nname = "x"\n\n[store]\nurl = "memory://"\n')
    assert load_store_config(config) == StoreConfig(url="memory://")
    assert load_config(config).name == "x"  # the agent loader accepts the table
    assert load_store_config(None) == StoreConfig()
    config.write_text('[store]\nurl = "memory://"\nuri = "typo"\n')
    with pytest.raises(ConfigError, match=r"\[store\] uri in .*agent\.toml"):
        load_store_config(config)
    config.write_text('store = "postgresql://h/db"\n')
    with pytest.raises(ConfigError, match=r"\[store\] .* must be a table"):
        load_store_config(config)


async def test_agent_flow_run_keeps_its_session_in_postgresql_and_continues_it(
    pg_schema: str, openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    openai_server.script(
        sse_reply(text_chunks("The answer is 42.")), sse_reply(text_chunks("Still 42."))
    )
    url = f"{URL}?schema={pg_schema}"
    base = ["--model", "test-model", "--base-url", openai_server.base_url, "--db", url]
    code, out, err = await asyncio.to_thread(_cli, ["run", "what is the answer?", *base])
    assert code == 0, err
    assert f"saved in {url}" in out
    async with open_store(url) as store:
        (info,) = await store.list()
    assert info.status == "completed"
    code, out, err = await asyncio.to_thread(
        _cli, ["run", "and again?", *base, "--session", info.id]
    )
    assert code == 0, err
    async with open_store(url) as store:
        state = await store.load(info.id)
    assert [entry.kind for entry in state.entries] == [
        "user_message",
        "agent_message",
        "user_message",
        "agent_message",
    ]
    assert not (tmp_path / "home" / "sessions.db").exists()


async def test_two_processes_writing_one_session_never_corrupt_it(pg_schema: str) -> None:
    url = f"{URL}?schema={pg_schema}"
    async with open_store(url) as store:
        info = await store.create()
    rounds = 8
    rivals = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.store_helpers.rival_writer"),
            *(url, info.id, name, str(rounds)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        for name in ("a", "b")
    ]
    for rival in rivals:  # both connected...
        assert rival.stdout is not None
        assert await rival.stdout.readline() == b"ready\n"
    for rival in rivals:  # ...then both go at once
        assert rival.stdin is not None
        rival.stdin.write(b"go\n")
        await rival.stdin.drain()
    outputs = await asyncio.gather(*(rival.communicate() for rival in rivals))
    assert [rival.returncode for rival in rivals] == [0, 0], [err for _, err in outputs]
    lines = [json.loads(line) for out, _ in outputs for line in out.decode().splitlines()]
    committed = {line["steps"]: line for line in lines if "steps" in line}
    conflicts = [line["conflict"] for line in lines if "conflict" in line]
    # Every committed step has its own step number: no two commits were applied as one.
    assert len(committed) == len(lines) - len(conflicts)
    assert len(conflicts) <= 1 and len(committed) >= rounds
    async with open_store(url) as store:
        state = await store.load(info.id)
        events = await store.events(info.id)
    # The session is exactly the last committed step, whole, with every step's events once.
    last = committed[max(committed)]
    assert state.info.steps == len(committed) == max(committed)
    assert [entry.id for entry in state.entries] == last["entries"]
    assert state.environment is not None
    assert state.environment.to_json() == last["environment"]
    assert len(events) == 2 * len(committed)


async def _pool_backend(store: PostgresSessionStore) -> int:
    async with (await store._backend._ready()).connection() as conn:  # type: ignore[attr-defined]
        row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
    assert row is not None
    return int(row["pid"])


@pytest.mark.parametrize("saves", [1, 3])
async def test_a_pooled_connection_whose_backend_was_terminated_is_replaced_before_a_write(
    pg_schema: str, saves: int
) -> None:
    """A database restart or a proxy's idle cut ends a connection resting in the pool: the
    next writes go out on a new connection, never fail on the dead one (no retry here)."""
    history, environment = add_step_fresh()
    async with PostgresSessionStore(URL, schema=pg_schema) as store:
        info = await store.create()
        backend = await _pool_backend(store)
        with psycopg.connect(URL, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone() == (
                True,
            )
            for _ in range(500):  # until the backend has exited and closed its socket
                gone = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)
                ).fetchone()
                if gone == (0,):
                    break
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the end of the stream reaches the client's socket
        for _ in range(saves):
            info = await store.save_step(info.id, history=history, environment=environment)
        assert await _pool_backend(store) != backend
        assert (await store.load(info.id)).entries == tuple(history.entries)


_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)


@pytest.fixture
def pg_session(pg_schema: str) -> tuple[str, str]:
    """A migrated schema holding one session: (schema, session id)."""

    async def create() -> str:
        async with PostgresSessionStore(URL, schema=pg_schema) as store:
            return (await store.create()).id

    return pg_schema, asyncio.run(create())


@settings(
    max_examples=30,
    deadline=None,
    # One session for all examples: each example replaces its events.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    rows=st.lists(
        st.tuples(_TEXT, st.integers(0, 2**31 - 1), _TEXT, _TEXT, st.integers(0, 2**62)),
        max_size=30,
        unique_by=lambda row: row[4],  # event ids are unique in a session
    ),
    first=st.integers(0, 1000),
)
def test_a_steps_events_are_stored_exactly_as_given_in_one_statement(
    pg_session: tuple[str, str], rows: list[tuple[str, int, str, str, int]], first: int
) -> None:
    """Any text (quotes, backslashes, JSON escapes, any script) and any id comes back as it
    went in, each event at its position, in order."""
    from agent_flow.sessions._backend import _EventRow
    from agent_flow.sessions._pg_rows import _insert_rows

    schema, session = pg_session
    events = [_EventRow(run_id, seq, kind, data) for run_id, seq, kind, data, _ in rows]
    ids = [number for *_, number in rows]

    async def store_and_read() -> list[tuple[object, ...]]:
        conn = await psycopg.AsyncConnection.connect(
            URL, options=f"-c search_path={schema}", row_factory=dict_row
        )
        async with conn, conn.transaction():
            await conn.execute("DELETE FROM events WHERE session_id = %s", (session,))
            await _insert_rows(conn, session, events_at=first, events=events, ids=ids)
            cursor = await conn.execute(
                "SELECT position, event_id, run_id, seq, kind, data FROM events "
                "WHERE session_id = %s ORDER BY position",
                (session,),
            )
            return [tuple(row.values()) for row in await cursor.fetchall()]

    stored = asyncio.run(store_and_read())
    assert stored == [
        (first + i, number, run_id, seq, kind, data)
        for i, (run_id, seq, kind, data, number) in enumerate(rows)
    ]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    entries=st.lists(st.tuples(_TEXT, _TEXT, _TEXT), max_size=8),
    changes=st.lists(_TEXT, max_size=8),
    first=st.integers(0, 1000),
    notify=st.booleans(),
)
def test_a_steps_entries_and_changes_are_stored_exactly_and_followers_told_only_when_asked(
    pg_session: tuple[str, str],
    entries: list[tuple[str, str, str]],
    changes: list[str],
    first: int,
    notify: bool,
) -> None:
    """The other parts of the step's one statement: entries at their positions, changes at
    their versions, whatever the text, and a notification at commit exactly when asked."""
    from agent_flow.sessions._backend import _EntryRow
    from agent_flow.sessions._pg_rows import _insert_rows

    schema, session = pg_session
    channel = f"af_test_{uuid.uuid4().hex[:12]}"

    async def store_and_read() -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], int]:
        listener = await psycopg.AsyncConnection.connect(URL, autocommit=True)
        async with listener:
            await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            conn = await psycopg.AsyncConnection.connect(
                URL, options=f"-c search_path={schema}", row_factory=dict_row
            )
            async with conn:
                async with conn.transaction():
                    await conn.execute("DELETE FROM entries WHERE session_id = %s", (session,))
                    await conn.execute(
                        "DELETE FROM environment_changes WHERE session_id = %s", (session,)
                    )
                    await _insert_rows(
                        conn,
                        session,
                        entries_at=first,
                        entries=[_EntryRow(*entry) for entry in entries],
                        changes=[(first + i, data) for i, data in enumerate(changes)],
                        events_at=0,
                        events=(),
                        ids=(),
                        notify=channel if notify else None,
                    )
                stored_entries = await (
                    await conn.execute(
                        "SELECT position, entry_id, kind, data FROM entries "
                        "WHERE session_id = %s ORDER BY position",
                        (session,),
                    )
                ).fetchall()
                stored_changes = await (
                    await conn.execute(
                        "SELECT version, data FROM environment_changes "
                        "WHERE session_id = %s ORDER BY version",
                        (session,),
                    )
                ).fetchall()
            told = [n async for n in listener.notifies(timeout=0.1, stop_after=1)]
        return (
            [tuple(row.values()) for row in stored_entries],
            [tuple(row.values()) for row in stored_changes],
            len(told),
        )

    stored_entries, stored_changes, told = asyncio.run(store_and_read())
    assert stored_entries == [(first + i, *entry) for i, entry in enumerate(entries)]
    assert stored_changes == [(first + i, data) for i, data in enumerate(changes)]
    assert told == (1 if notify else 0)
