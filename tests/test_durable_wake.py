"""Workers are told of queued runs (PostgreSQL LISTEN/NOTIFY) instead of polling for them.

Each worker here looks for queued runs by itself only every 30 s (``idle_seconds``) and DBOS's
own queue threads are stopped, so a run that starts within a few seconds was started because
the worker was told: by the client's notification, by the end of the session's run
before it, or by the reconnection of a dropped LISTEN connection.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.durable import DurableClient, DurableConfig, DurableWorker
from agent_flow.llm.base import LLMClient
from agent_flow.sessions.protocol import SessionStore
from agent_flow.tools import ToolExecutor
from tests.durable_app import model_and_tools
from tests.durable_helpers import in_process, pg

__all__ = ["pg"]  # fixture

#: Far above what a told worker takes (tens of ms), far below its own look (30 s).
PROMPT = 5.0


@asynccontextmanager
async def told_worker(
    urls: tuple[str, str],
    folder: Path | None,
    model: tuple[LLMClient, ToolExecutor] | None = None,
    **settings: float | None,
) -> AsyncIterator[tuple[SessionStore, DurableClient, DurableWorker]]:
    """A worker in this process that looks by itself only every 30 s, and a client.

    Its model and tools: `model`, else the counting ones of `tests.durable_app` (in `folder`).
    """
    store_url, system_url = urls
    durable = DurableConfig.model_validate(
        {"enabled": True, "system_database_url": system_url, "idle_seconds": 30.0, **settings}
    )
    assert model is not None or folder is not None
    llm, tools = model if model is not None else model_and_tools(folder, None)
    async with (
        in_process(durable, store_url, llm, tools) as (store, worker),
        DurableClient(durable, store) as client,
    ):
        yield store, client, worker


async def _times(store: SessionStore, session_id: str, run_id: str) -> tuple[float, float]:
    events = await store.events(session_id, run_id=run_id)
    started = next(e for e in events if e.kind == "run_started")
    finished = next(e for e in events if e.kind == "run_finished")
    return started.timestamp.timestamp(), finished.timestamp.timestamp()


async def _run_once(store: SessionStore, client: DurableClient) -> tuple[str, float]:
    """Enqueue one run on a new session and wait for it: its final text, and how many seconds
    after its enqueue it started."""
    info = await store.create(agent="durable")
    enqueued = time.time()
    handle = await client.enqueue(info.id, "count 1")
    outcome = await asyncio.wait_for(handle.outcome(poll_seconds=0.02), 20)
    started, _ = await _times(store, info.id, handle.run_id)
    return outcome.final_text, started - enqueued


def _admin(pg: tuple[str, str]) -> Any:
    """A connection to the cluster's ``postgres`` database, to end other connections."""
    import psycopg

    return psycopg.connect(pg[1].rpartition("/")[0] + "/postgres", autocommit=True)


async def test_a_queued_run_starts_when_enqueued_not_at_the_next_look(
    pg: tuple[str, str], tmp_path: Path
) -> None:
    async with told_worker(pg, tmp_path) as (store, client, worker):
        await asyncio.sleep(0.5)  # past the look a worker makes when it starts listening
        text, delay = await _run_once(store, client)
        assert text == "done"
        assert delay < PROMPT, delay
        assert worker._dequeuer is not None and worker._dequeuer.notified >= 1


async def test_a_dropped_listen_connection_is_made_again_and_runs_still_start(
    pg: tuple[str, str], tmp_path: Path
) -> None:
    async with told_worker(pg, tmp_path) as (store, client, worker):
        dequeuer = worker._dequeuer
        assert dequeuer is not None
        database = pg[1].rpartition("/")[2]
        for _ in range(100):
            if dequeuer.connects == 1:
                break
            await asyncio.sleep(0.05)
        with _admin(pg) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND query = 'LISTEN agent_flow_queue'",
                (database,),
            ).fetchall()
        assert killed == [(True,)]
        for _ in range(200):
            if dequeuer.connects == 2:
                break
            await asyncio.sleep(0.05)
        assert dequeuer.connects == 2
        _, delay = await _run_once(store, client)
        assert delay < PROMPT, delay


async def test_a_dropped_notify_connection_is_made_again_and_runs_still_start_at_once(
    pg: tuple[str, str], tmp_path: Path
) -> None:
    """The client's NOTIFY connection, cut by the server between two enqueues, is made again
    on the next one: that run is still started by its notification, not by the worker's own
    look 30 s later."""
    async with told_worker(pg, tmp_path) as (store, client, worker):
        await asyncio.sleep(0.5)
        await _run_once(store, client)
        notifier = client._notifier
        assert notifier is not None and notifier._conn is not None
        backend = notifier._conn.info.backend_pid
        with _admin(pg) as admin:
            killed = admin.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchall()
        assert killed == [(True,)]
        text, delay = await _run_once(store, client)
        assert text == "done"
        assert delay < PROMPT, delay
        assert notifier._conn is not None and notifier._conn.info.backend_pid != backend
        assert worker._dequeuer is not None and worker._dequeuer.notified >= 2


async def test_two_clients_enqueuing_on_one_session_at_once_get_one_run_at_a_time(
    pg: tuple[str, str], tmp_path: Path
) -> None:
    """Two clients (two servers of a fleet) enqueue runs on one session at the same moment:
    each run executes once, never beside another run of the session, in some order."""
    async with told_worker(pg, tmp_path) as (store, client, _worker):
        durable = client.durable
        async with DurableClient(durable, store) as other:
            info = await store.create(agent="durable")
            handles = await asyncio.gather(
                *(c.enqueue(info.id, "count 1") for c in (client, other, client, other))
            )
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(h.outcome(poll_seconds=0.02) for h in handles)), 60
            )
        assert [o.final_text for o in outcomes] == ["done"] * 4
        assert len({h.run_id for h in handles}) == 4
        events = await store.events(info.id)
        for handle in handles:
            mine = [e.kind for e in events if e.run_id == handle.run_id]
            assert mine.count("run_started") == 1 and mine.count("run_finished") == 1, mine
        spans = sorted([await _times(store, info.id, h.run_id) for h in handles])
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, spans


@pytest.mark.timeout(240)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=3))
async def test_runs_of_one_session_follow_each_other_at_once_and_never_overlap(
    pg: tuple[str, str], tmp_path: Path, plan: list[int]
) -> None:
    """`plan[i]` runs of session i, enqueued together: each session's runs execute one at
    a time, and each starts promptly after the one before it ends (the worker looks again
    when a run ends), never waiting for the worker's own look."""
    async with told_worker(pg, tmp_path) as (store, client, _worker):
        queued: list[tuple[str, list[str]]] = []
        for runs in plan:
            info = await store.create(agent="durable")
            handles = [await client.enqueue(info.id, "count 1") for _ in range(runs)]
            queued.append((info.id, [handle.run_id for handle in handles]))
            outcomes = [
                client.handle(h.run_id, info.id).outcome(poll_seconds=0.02) for h in handles
            ]
            await asyncio.wait_for(asyncio.gather(*outcomes), 60)
        for session_id, run_ids in queued:
            spans = sorted([await _times(store, session_id, run_id) for run_id in run_ids])
            for (_, end), (start, _) in itertools.pairwise(spans):
                assert start >= end, spans  # one run of a session at a time
                assert start - end < PROMPT, spans  # and the next one at once


async def test_dbos_queue_threads_are_stopped_and_its_housekeeping_slowed(
    pg: tuple[str, str], tmp_path: Path
) -> None:
    """The DBOS internals `_wake` relies on exist in the installed DBOS (an upgrade that moves
    them fails here, not silently in a fleet's idle cost)."""
    from dbos import _workflow_commands
    from dbos._dbos import _get_dbos_instance

    from agent_flow._defaults import DURABLE_DBOS_HOUSEKEEPING_SECONDS
    from agent_flow.durable._wake import quiet_dbos

    async with told_worker(pg, tmp_path) as (_store, _client, worker):
        assert worker.dbos_queue_threads_stopped
        for _ in range(100):
            pollers = [
                thread.name
                for thread in threading.enumerate()
                if "(queue_thread)" in thread.name or thread.name.startswith("queue-worker-")
            ]
            if not pollers:
                break
            await asyncio.sleep(0.1)
        assert pollers == []
        assert quiet_dbos(DURABLE_DBOS_HOUSEKEEPING_SECONDS) == []
        assert _workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC >= DURABLE_DBOS_HOUSEKEEPING_SECONDS
        internal = _get_dbos_instance()._registry.get_internal_queue()
        assert internal._polling_interval_sec >= DURABLE_DBOS_HOUSEKEEPING_SECONDS


@pytest.mark.parametrize(
    ("worker", "fleet"), [(2, None), (None, 2)], ids=["worker_concurrency", "global_concurrency"]
)
async def test_a_told_worker_keeps_its_concurrency_limits(
    pg: tuple[str, str], worker: int | None, fleet: int | None
) -> None:
    """Every run's end and every notification make the worker look again: however many looks,
    no more runs execute at once than its limits allow (one look at a time, DBOS's claim)."""
    from agent_flow.llm.base import LLMRequest
    from agent_flow.testing import FunctionLLM, Reply, call, reply
    from agent_flow.tools import tool

    running, most = 0, 0

    @tool
    async def work() -> str:
        """Work a while."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.3)
        running -= 1
        return "worked"

    def play(request: LLMRequest) -> Reply:
        if any(m.role == "tool" for m in request.messages):
            return reply("done")
        return reply(tool_calls=[call("work")])

    model = (FunctionLLM(play), ToolExecutor([work]))
    limits = {"worker_concurrency": worker, "global_concurrency": fleet}
    async with told_worker(pg, None, model, **limits) as (store, client, _worker):
        handles = []
        for _ in range(6):
            info = await store.create(agent="durable")
            handles.append(await client.enqueue(info.id, "work"))
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(h.outcome(poll_seconds=0.05) for h in handles)), 60
        )
    assert [outcome.final_text for outcome in outcomes] == ["done"] * 6
    assert most == 2


async def test_an_idle_look_finds_nothing_cheaply_and_a_queued_run_all_the_same(
    pg: tuple[str, str], tmp_path: Path
) -> None:
    """Looking every 0.1 s with nothing queued, the worker makes no pass of DBOS's claim (its
    cheap read says nothing is queued); a run enqueued without a notification (as a lost one
    would leave it) is found by the next look."""
    from dbos import DBOSClient

    from agent_flow.durable._wake import SystemReads

    async with told_worker(pg, tmp_path, idle_seconds=0.1) as (store, _client, worker):
        dequeuer = worker._dequeuer
        assert dequeuer is not None and worker._reads is not None
        await asyncio.sleep(0.5)
        passes = dequeuer.passes
        await asyncio.sleep(1.0)  # ten idle looks
        assert dequeuer.passes == passes
        assert await worker._reads.pending_owners() == set()
        # Enqueued straight through DBOS: no notification.
        info = await store.create(agent="durable")
        silent = DBOSClient(system_database_url=pg[1], application_name="agent_flow")
        try:
            from agent_flow.durable._workflow import WORKFLOW_NAME, RunRequest
            from agent_flow.durable.config import app_version

            request = RunRequest(session_id=info.id, message="count 1", run_id="silent")
            options: Any = {
                "workflow_name": WORKFLOW_NAME,
                "queue_name": worker.durable.queue,
                "workflow_id": request.run_id,
                "app_version": app_version(),
                "queue_partition_key": info.id,
            }
            await silent.enqueue_async(options, request.model_dump_json())
        finally:
            silent.destroy()
        for _ in range(100):
            events = await store.events(info.id)
            if any(event.kind == "run_finished" for event in events):
                break
            await asyncio.sleep(0.1)
        assert [e.kind for e in events].count("run_finished") == 1
        assert dequeuer.notified == 0

    async def failing(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        import psycopg

        raise psycopg.errors.UndefinedTable('relation "dbos.workflow_status" does not exist')

    reads = SystemReads(failing)
    assert await reads.anything_queued("q") is True  # cannot tell: look in full
    assert await reads.pending_owners() is None
    assert reads._off
