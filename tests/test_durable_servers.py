"""Two servers and two durable workers on one PostgreSQL database, clients on both servers.

`agent-flow serve` with ``[durable] enabled = true`` (here: `create_app(..., durable=...)` on a
real uvicorn) enqueues each run on the DBOS queue; worker processes (`tests/durable_app.py`)
execute them; a client watching a session on either server gets every event of every run,
live, in order, with ids 0, 1, 2, ... (no gap, no duplicate), the same on both servers and the
same as the store holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from agent_flow.agent import StopReason
from agent_flow.durable import DurableClient, DurableConfig
from agent_flow.durable.client import RunHandle
from agent_flow.events import RunFinished
from agent_flow.llm.base import LLMClient
from agent_flow.server import create_app
from agent_flow.sessions import open_store
from agent_flow.testing import ScriptedLLM
from tests.durable_app import CONFIG
from tests.durable_helpers import Workers, counts_of, on_sqlite, pg, workers
from tests.server_harness import EventStream, serving, stream

__all__ = ["pg", "workers"]  # fixtures

SESSIONS = 6
RUNS_PER_SESSION = 2


def no_model(_config: object) -> LLMClient:
    raise AssertionError("a durable server runs no model itself")


async def until_run_finished(events: EventStream, run_id: str) -> list[tuple[int, str, str]]:
    """(id, kind, run id) of every frame up to the `run_finished` of `run_id`."""
    got: list[tuple[int, str, str]] = []
    while True:
        frame = await events.next()
        assert frame.id is not None and frame.event is not None, frame
        got.append((int(frame.id), frame.event, frame.json["run_id"]))
        if frame.event == "run_finished" and frame.json["run_id"] == run_id:
            return got


@pytest.mark.timeout(180)
async def test_two_servers_two_workers_every_stream_complete_in_order(
    pg: tuple[str, str], workers: Workers, tmp_path: Path
) -> None:
    store_url, system_url = pg
    durable = DurableConfig(enabled=True, system_database_url=system_url, poll_seconds=0.1)
    async with DurableClient(durable) as client_a, DurableClient(durable) as client_b:
        workers.start("w1")
        workers.start("w2")
        async with (
            open_store(store_url) as store_a,
            open_store(store_url) as store_b,
            serving(
                create_app(CONFIG, store=store_a, llm_factory=no_model, durable=client_a)
            ) as http_a,
            serving(
                create_app(CONFIG, store=store_b, llm_factory=no_model, durable=client_b)
            ) as http_b,
        ):
            servers = [http_a, http_b]
            sessions = []
            for index in range(SESSIONS):
                created = await servers[index % 2].post("/sessions", json={})
                assert created.status_code == 201, created.text
                sessions.append(created.json()["id"])

            async def drive(
                index: int, sid: str
            ) -> tuple[list[str], list[list[tuple[int, str, str]]]]:
                """Watch `sid` on both servers; send its runs through alternating servers."""
                async with contextlib.AsyncExitStack() as stack:
                    watchers = [
                        await stack.enter_async_context(stream(http, f"/sessions/{sid}/events"))
                        for http in servers
                    ]
                    seen: list[list[tuple[int, str, str]]] = [[], []]
                    run_ids = []
                    for run in range(RUNS_PER_SESSION):
                        sender = servers[(index + run) % 2]
                        sent = await sender.post(
                            f"/sessions/{sid}/messages", json={"message": f"count {run + 2}"}
                        )
                        assert sent.status_code == 202, sent.text  # answered at once
                        accepted = sent.json()
                        # Every id the run will hand out is above every id seen so far.
                        assert accepted["first_event_id"] > max(
                            (i for i, _, _ in seen[0]), default=-1
                        )
                        busy = await sender.post(
                            f"/sessions/{sid}/messages", json={"message": "count 1"}
                        )
                        assert busy.status_code == 409 and busy.json()["code"] == "run_in_progress"
                        run_ids.append(accepted["run_id"])
                        for side, watcher in enumerate(watchers):
                            seen[side] += await until_run_finished(watcher, accepted["run_id"])
                        # The enqueuing server says idle once the run is over.
                        for _ in range(100):
                            view = (await sender.get(f"/sessions/{sid}")).json()
                            if view["state"] == "idle":
                                break
                            await asyncio.sleep(0.05)
                        assert view["state"] == "idle", view
                    return run_ids, seen

            results = await asyncio.wait_for(
                asyncio.gather(*(drive(i, sid) for i, sid in enumerate(sessions))), 150
            )
            for sid, (run_ids, seen) in zip(sessions, results, strict=True):
                stored = [e for _, e in await store_a.events_with_ids(sid)]
                expected = [(i, e.kind, e.run_id) for i, e in await store_a.events_with_ids(sid)]
                assert seen[0] == seen[1] == expected, sid
                assert [kind for _, kind, _ in expected].count("run_finished") == RUNS_PER_SESSION
                for run, run_id in enumerate(run_ids):
                    assert counts_of(tmp_path, run_id) == list(range(1, run + 3))
                    seqs = [e.seq for e in stored if e.run_id == run_id]
                    assert seqs == list(range(len(seqs)))
            all_runs = [run_id for run_ids, _ in results for run_id in run_ids]
            listed = await client_a._client.list_workflows_async(
                workflow_ids=all_runs, load_input=False, load_output=False
            )
            executors = [w.executor_id for w in listed]
            assert len(executors) == len(all_runs) and set(executors) <= {"w1", "w2"}
            print("runs per worker:", {e: executors.count(e) for e in sorted(set(executors))})
            state = await store_a.load(sessions[0])
            assert [e.kind for e in state.entries].count("tool_result") == 2 + 3


async def test_a_durable_server_refuses_in_process_agents(tmp_path: Path) -> None:
    durable = DurableConfig(enabled=True, system_database_url=f"sqlite:///{tmp_path}/dbos.db")
    async with DurableClient(durable) as client, open_store("memory://") as store:
        app = create_app(
            CONFIG, store=store, llm_factory=lambda _c: ScriptedLLM([]), durable=client
        )
        async with serving(app) as http:
            sid = (await http.post("/sessions", json={})).json()["id"]
            resumed = await http.post(f"/sessions/{sid}/resume", json={})
            assert resumed.status_code == 409 and resumed.json()["code"] == "runs_elsewhere"
            idle = await http.post(f"/sessions/{sid}/cancel", json={})
            assert idle.status_code == 409 and idle.json()["code"] == "not_running"


def test_serve_enqueues_only_when_the_config_says_durable(tmp_path: Path) -> None:
    from agent_flow.cli._serve import _durable_client

    assert _durable_client(None) is None
    plain = tmp_path / "plain.toml"
    plain.write_text('[agent]\nname = "a"\n')
    assert _durable_client(str(plain)) is None
    durable = tmp_path / "durable.toml"
    durable.write_text(
        f'[durable]\nenabled = true\nsystem_database_url = "sqlite:///{tmp_path}/dbos.db"\n'
    )
    client = _durable_client(str(durable))
    assert isinstance(client, DurableClient)
    client.close()


@pytest.mark.timeout(120)
async def test_a_durable_servers_state_and_cancel_follow_the_run(tmp_path: Path) -> None:
    from tests.durable_app import model_and_tools

    # A run slow enough (50 steps of 0.05 s at least) to be cancelled while it runs.
    llm, tools = model_and_tools(tmp_path, None, pause=0.05)
    async with (
        on_sqlite(tmp_path, llm, tools) as (store, client),
        serving(create_app(CONFIG, store=store, llm_factory=no_model, durable=client)) as http,
    ):
        sid = (await http.post("/sessions", json={})).json()["id"]
        async with stream(http, f"/sessions/{sid}/events") as events:
            sent = await http.post(f"/sessions/{sid}/messages", json={"message": "count 500"})
            run_id = sent.json()["run_id"]
            await events.until("tool_call_completed")  # it runs, in the worker
            assert (await http.get(f"/sessions/{sid}")).json()["state"] == "running"
            cancelled = await http.post(f"/sessions/{sid}/cancel", json={})
            assert cancelled.status_code == 200 and cancelled.json()["run_id"] == run_id
            for _ in range(400):
                if (await http.get(f"/sessions/{sid}")).json()["state"] == "idle":
                    break
                await asyncio.sleep(0.05)
            assert (await http.get(f"/sessions/{sid}")).json()["state"] == "idle"
        assert await client.handle(run_id, sid).state() == "cancelled"
        ran = counts_of(tmp_path, run_id)
        assert 1 <= len(ran) < 500
        # The run ended as a cancelled run: its end is stored, and DBOS agrees.
        events = await store.events(sid, run_id=run_id)
        finished = [e for e in events if isinstance(e, RunFinished)]
        assert [e.stop_reason for e in finished] == [StopReason.CANCELLED]
        assert (await store.info(sid)).status == "cancelled"
        outcome = await client.handle(run_id, sid).outcome()
        assert outcome.stop_reason == StopReason.CANCELLED
        assert len(outcome.tool_uses) == len(ran)
    # Looking for the cancellation recorded no step of the workflow in DBOS's tables.
    with sqlite3.connect(tmp_path / "dbos.sqlite") as db:
        (steps,) = db.execute(
            "SELECT count(*) FROM operation_outputs WHERE workflow_uuid = ?", (run_id,)
        ).fetchone()
    assert steps == 0


async def test_a_durable_session_deleted_while_it_runs_is_deleted_once_its_worker_let_go(
    tmp_path: Path,
) -> None:
    """DELETE cancels the worker's run, then waits (a moment) for the worker to give the
    session's claim back, and only then deletes it: not from under the worker, and no 409
    for a run the server itself just stopped."""
    from tests.durable_app import model_and_tools

    llm, tools = model_and_tools(tmp_path, None, pause=0.05)
    async with (
        on_sqlite(tmp_path, llm, tools) as (store, client),
        serving(create_app(CONFIG, store=store, llm_factory=no_model, durable=client)) as http,
    ):
        sid = (await http.post("/sessions", json={})).json()["id"]
        async with stream(http, f"/sessions/{sid}/events") as events:
            sent = await http.post(f"/sessions/{sid}/messages", json={"message": "count 500"})
            run_id = sent.json()["run_id"]
            await events.until("tool_call_completed")  # it runs, in the worker
            assert (await store.info(sid)).lease_run == run_id  # the worker's claim
            deleted = await http.delete(f"/sessions/{sid}")
            assert deleted.status_code == 204, deleted.text
        assert (await http.get(f"/sessions/{sid}")).status_code == 404
        # The worker's run stopped before the delete (it counted a step every 0.05 s).
        ran = len(counts_of(tmp_path, run_id))
        await asyncio.sleep(0.3)
        assert 1 <= len(counts_of(tmp_path, run_id)) == ran < 500


async def test_any_server_cancels_or_deletes_a_durable_run_another_server_enqueued(
    tmp_path: Path,
) -> None:
    """DBOS is the fleet's: a cancel or a delete sent to a server that did not enqueue the
    run reaches it all the same (through DBOS), where a server's own run would be refused."""
    from tests.durable_app import model_and_tools

    llm, tools = model_and_tools(tmp_path, None, pause=0.05)
    async with (
        on_sqlite(tmp_path, llm, tools) as (store, client),
        serving(create_app(CONFIG, store=store, llm_factory=no_model, durable=client)) as a,
        serving(create_app(CONFIG, store=store, llm_factory=no_model, durable=client)) as b,
    ):
        for action in ("cancel", "delete"):
            sid = (await a.post("/sessions", json={})).json()["id"]
            async with stream(a, f"/sessions/{sid}/events") as events:
                sent = await a.post(f"/sessions/{sid}/messages", json={"message": "count 500"})
                run_id = sent.json()["run_id"]
                await events.until("tool_call_completed")  # it runs, in the worker
                if action == "cancel":
                    cancelled = await b.post(f"/sessions/{sid}/cancel", json={})
                    assert cancelled.status_code == 200, cancelled.text
                    assert cancelled.json()["run_id"] == run_id
                    finished = await events.until("run_finished")
                    assert finished[-1].json["stop_reason"] == "cancelled"
                else:
                    # One more run, enqueued behind it (a session's runs go one at a time).
                    queued = await client.enqueue(sid, "count 3")
                    deleted = await b.delete(f"/sessions/{sid}")
                    assert deleted.status_code == 204, deleted.text
                    assert (await a.get(f"/sessions/{sid}")).status_code == 404
                    # Neither is left to run against a session that is gone.
                    for run in (run_id, queued.run_id):
                        assert await RunHandle(client._client, run, sid).state() == "cancelled"
            ran = len(counts_of(tmp_path, run_id))
            await asyncio.sleep(0.3)
            assert 1 <= len(counts_of(tmp_path, run_id)) == ran < 500


async def test_a_durable_server_refuses_to_cancel_or_delete_a_run_no_worker_runs(
    tmp_path: Path,
) -> None:
    """The session's claim held by a writer that is no durable run (``agent-flow run`` on the
    same store, say): DBOS cannot cancel it, so neither cancel nor delete pretends to."""
    from tests.durable_app import model_and_tools

    llm, tools = model_and_tools(tmp_path, None)
    async with (
        on_sqlite(tmp_path, llm, tools) as (store, client),
        serving(create_app(CONFIG, store=store, llm_factory=no_model, durable=client)) as http,
    ):
        sid = (await http.post("/sessions", json={})).json()["id"]
        await store.claim(sid, run_id="cli-run", holder="1@elsewhere", ttl=3600)
        cancelled = await http.post(f"/sessions/{sid}/cancel", json={})
        assert cancelled.status_code == 409, cancelled.text
        assert (cancelled.json()["code"], cancelled.json()["run_id"]) == ("not_running", "cli-run")
        deleted = await http.delete(f"/sessions/{sid}")
        assert deleted.status_code == 409, deleted.text
        assert (deleted.json()["code"], deleted.json()["run_id"]) == ("run_in_progress", "cli-run")
        assert (await http.get(f"/sessions/{sid}")).status_code == 200


async def test_a_run_whose_session_is_gone_fails_at_once_not_as_an_outage(tmp_path: Path) -> None:
    """A run dequeued for a session deleted meanwhile (by a client of the store, say) has
    nothing to wait for: it fails saying so, not after the store-outage window."""
    from agent_flow.errors import AgentFlowError
    from tests.durable_app import model_and_tools

    llm, tools = model_and_tools(tmp_path, None)
    async with on_sqlite(tmp_path, llm, tools) as (_store, client):
        handle = await client.enqueue("gone-session", "count 3")
        async with asyncio.timeout(30):  # (the outage window is 300 s)
            with pytest.raises(AgentFlowError, match="no session 'gone-session'"):
                await handle.outcome()
