"""Fixtures of the durable-run tests: a fresh PostgreSQL schema and DBOS database, worker
processes (`tests/durable_app.py`), and the tool's side-effect counters."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent_flow.agent import AgentExecutor
from agent_flow.durable import DurableClient, DurableConfig, DurableWorker
from agent_flow.llm.base import LLMClient
from agent_flow.sessions import open_store
from agent_flow.sessions.protocol import SessionStore
from agent_flow.tools import ToolExecutor
from tests.durable_app import CONFIG
from tests.store_helpers.postgres import URL, drop_schema, require_postgres

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pg() -> Iterator[tuple[str, str]]:
    """A session store URL (fresh schema) and a DBOS system database URL (fresh database)."""
    require_postgres()
    import psycopg
    from psycopg import sql

    suffix = uuid.uuid4().hex[:12]
    schema, database = f"af_durable_{suffix}", f"af_dbos_{suffix}"
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    base, _, _ = URL.rpartition("/")
    try:
        yield f"{URL}?schema={schema}", f"{base}/{database}"
    finally:
        drop_schema(schema)
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )


def counts_of(directory: Path, run_id: str) -> list[int]:
    path = directory / f"{run_id}.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


class Workers:
    """Worker processes of one test; every one is killed at the end."""

    def __init__(self, store: str, system: str, counts: Path) -> None:
        self.args = [store, system, str(counts)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, executor: str, kill_at: int | None = None) -> subprocess.Popen[bytes]:
        extra = [str(kill_at)] if kill_at is not None else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.durable_app", *self.args, executor, *extra],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def workers(pg: tuple[str, str], tmp_path: Path) -> Iterator[Workers]:
    group = Workers(pg[0], pg[1], tmp_path)
    try:
        yield group
    finally:
        group.stop()


async def wait_dead(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Wait for the process to exit (it kills itself; a process has no event to await)."""
    await asyncio.wait_for(asyncio.to_thread(proc.wait), seconds)


@asynccontextmanager
async def in_process(
    durable: DurableConfig,
    store_url: str,
    llm: LLMClient,
    tools: ToolExecutor,
    *,
    on_agent: Callable[[AgentExecutor], object] | None = None,
) -> AsyncIterator[tuple[SessionStore, DurableWorker]]:
    """A store, and a worker in this process on `llm` and `tools`."""
    async with (
        open_store(store_url) as store,
        DurableWorker(
            durable,
            store,
            CONFIG,
            llm_factory=lambda _config: (llm, None),
            tools_factory=lambda _config: tools,
            on_agent=on_agent,
        ) as worker,
    ):
        yield store, worker


@asynccontextmanager
async def on_sqlite(
    folder: Path,
    llm: LLMClient,
    tools: ToolExecutor,
    *,
    on_agent: Callable[[AgentExecutor], object] | None = None,
) -> AsyncIterator[tuple[SessionStore, DurableClient]]:
    """A worker in this process and a client, with DBOS and the sessions on SQLite in `folder`."""
    durable = DurableConfig(
        enabled=True, system_database_url=f"sqlite:///{folder}/dbos.sqlite", poll_seconds=0.05
    )
    store_url = f"sqlite:///{folder}/sessions.db"
    async with (
        in_process(durable, store_url, llm, tools, on_agent=on_agent) as (store, _worker),
        DurableClient(durable) as client,
    ):
        yield store, client


async def assert_each_ran_once(
    store: SessionStore, counts: Path, runs: list[tuple[str, str]], outcomes: dict[str, Any]
) -> None:
    """Every run of `runs` (session, run) finished once: its answer, one start and one end,
    ids without gap or repeat, its session left completed and unclaimed, and its counting
    tool (not idempotent) run at most once per call and exactly once per completed call."""
    for session_id, run_id in runs:
        outcome = outcomes[run_id]
        assert outcome.final_text == "done", (run_id, outcome)
        events = await store.events(session_id, run_id=run_id)
        assert [e.seq for e in events] == list(range(len(events))), run_id
        kinds = [e.kind for e in events]
        assert kinds.count("run_started") == 1 and kinds.count("run_finished") == 1
        info = await store.info(session_id)
        assert info.status == "completed" and info.lease_run is None, info
        executed = counts_of(counts, run_id)
        assert len(executed) == len(set(executed)), (run_id, executed)
        for use in outcome.tool_uses:
            n = json.loads(use.arguments)["n"]
            if use.error_kind != "interrupted":
                assert executed.count(n) == 1, (run_id, executed)


async def until(check: Callable[[], bool], seconds: float) -> None:
    """Wait until `check()` holds (something outside the event loop: a file, a process)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
