"""The SQLite store's file: its schema version and migrations, the export line types, deleting,
where the file lives, and what importing the package loads."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

import agent_flow.sessions.export as export_module
import agent_flow.sessions.sqlite as sqlite_module
from agent_flow.environment import Environment
from agent_flow.errors import StoreError
from agent_flow.history import (
    History,
)
from agent_flow.sessions import (
    SCHEMA_VERSION,
    Checkpoint,
    ExportLine,
    SQLiteSessionStore,
    default_store_path,
)
from agent_flow.tokens import ApproxCounter
from tests.store_helpers.session_writer import add_step
from tests.store_helpers.trace import Trace

COUNTER = ApproxCounter()


def fresh() -> tuple[History, Environment]:
    return History(counter=COUNTER), Environment(max_changes=5)


# -- schema -----------------------------------------------------------------------------------


async def test_a_store_file_with_a_newer_schema_is_refused_with_a_clear_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sessions.db"
    async with SQLiteSessionStore(path) as store:
        await store.create(session_id="kept")
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    newer = SQLiteSessionStore(path)
    with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 1}, newer.*upgrade"):
        await newer.list()
    with pytest.raises(StoreError, match="schema version"):
        async with SQLiteSessionStore(path):
            pass
    await newer.aclose()


async def test_a_file_that_is_not_a_session_store_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as raw:
        raw.execute("CREATE TABLE notes (text TEXT)")
    raw.close()
    store = SQLiteSessionStore(other)
    with pytest.raises(StoreError, match="not an agent_flow session store"):
        await store.list()
    await store.aclose()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database at all" * 100)
    store = SQLiteSessionStore(garbage)
    with pytest.raises(StoreError, match=r"garbage\.db"):
        await store.list()
    await store.aclose()


async def test_opening_an_older_schema_runs_the_missing_migrations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sessions.db"
    history, environment = fresh()
    async with SQLiteSessionStore(path) as store:
        info = await store.create()
        add_step(history, environment, 0)
        await store.save_step(info.id, history=history, environment=environment)

    def add_pinned(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE sessions ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr(sqlite_module, "_MIGRATIONS", (*sqlite_module._MIGRATIONS, add_pinned))
    monkeypatch.setattr(sqlite_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    async with SQLiteSessionStore(path) as store:
        state = await store.load(info.id)
        assert state.entries == tuple(history.entries)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION + 1,)
        assert raw.execute("SELECT pinned FROM sessions").fetchall() == [(0,)]
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    raw.close()


# -- export and import ------------------------------------------------------------------------


def test_every_export_line_class_is_in_the_union_with_a_distinct_kind() -> None:
    members = typing.get_args(typing.get_args(ExportLine)[0])
    defined = {
        obj
        for obj in vars(export_module).values()
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__name__.endswith("Line")
    }
    assert set(members) == defined
    kinds = [cls.model_fields["kind"].default for cls in members]
    assert len(kinds) == len(set(kinds))


# -- the rest of the API ----------------------------------------------------------------------


async def test_delete_removes_a_session_and_everything_stored_with_it(tmp_path: Path) -> None:
    """What a delete leaves in the file (the behaviour is in tests/test_store_conformance.py)."""
    path = tmp_path / "sessions.db"
    history, environment = fresh()
    async with SQLiteSessionStore(path) as store:
        for sid in ("gone", "kept"):
            await store.create(session_id=sid)
            events = add_step(history, environment, 0)
            await store.save_step(
                sid,
                history=history,
                environment=environment,
                events=events,
                checkpoints=[Checkpoint("run", 0, "model_call", "{}")],
            )
        await store.delete("gone")
    with sqlite3.connect(path) as raw:
        for table in ("entries", "environment_changes", "events", "checkpoints"):
            ids = {sid for (sid,) in raw.execute(f"SELECT DISTINCT session_id FROM {table}")}
            assert ids == {"kept"}, table
    raw.close()


def test_the_default_path_follows_agent_flow_home_then_xdg_then_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "af"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "af" / "sessions.db"
    monkeypatch.delenv("AGENT_FLOW_HOME")
    assert default_store_path() == tmp_path / "xdg" / "agent_flow" / "sessions.db"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/path")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / ".local/share/agent_flow/sessions.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert SQLiteSessionStore().path == tmp_path / "home" / ".local/share/agent_flow/sessions.db"


async def test_the_store_file_and_its_folders_are_created_on_first_use(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "sessions.db"
    trace = Trace()
    async with SQLiteSessionStore(path, trace=trace) as store:
        await store.create(session_id="s")
        assert [s.id for s in await store.list()] == ["s"]
    # Durable at every commit unless asked otherwise.
    assert "PRAGMA synchronous = FULL" in trace.statements
    assert path.is_file()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    raw.close()


def test_importing_the_sessions_package_loads_sqlite3_only_when_the_sqlite_store_is_used() -> None:
    # `import agent_flow` imports the package for the SessionStore protocol; sqlite3 waits
    # until someone asks for the SQLite store.
    code = (
        "import sys\n"
        "import agent_flow, agent_flow.sessions as sessions\n"
        "assert 'sqlite3' not in sys.modules, 'sqlite3 was imported eagerly'\n"
        "assert sessions.SQLiteSessionStore.__module__ == 'agent_flow.sessions.sqlite'\n"
        "assert 'sqlite3' in sys.modules\n"
        "assert all(hasattr(sessions, name) for name in sessions.__all__)\n"
        "try:\n"
        "    sessions.nothing_here\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('a missing name resolved')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
