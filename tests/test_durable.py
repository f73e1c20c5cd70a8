"""Durable runs on DBOS: a run completes, and survives SIGKILLed workers exactly once.

The workers are real processes (`tests/durable_app.py`) on a real PostgreSQL: a fresh schema
for the sessions and a fresh database for DBOS's system tables, both dropped after the test.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from agent_flow.durable import DurableClient, DurableConfig
from agent_flow.sessions import open_store
from tests.durable_app import model_and_tools
from tests.durable_helpers import Workers, counts_of, on_sqlite, pg, wait_dead, workers

__all__ = ["pg", "workers"]  # fixtures


async def test_a_durable_run_completes_with_its_events_in_the_store(tmp_path: Path) -> None:
    llm, tools = model_and_tools(tmp_path, None)
    async with on_sqlite(tmp_path, llm, tools) as (store, client):
        info = await store.create(agent="durable")
        handle = await client.enqueue(info.id, "count 3")
        outcome = await asyncio.wait_for(handle.outcome(), 60)
        assert outcome.final_text == "done"
        assert [use.content for use in outcome.tool_uses] == ["counted 1", "counted 2", "counted 3"]
        assert counts_of(tmp_path, handle.run_id) == [1, 2, 3]
        assert await handle.state() == "succeeded"
        events = await store.events(info.id, run_id=handle.run_id)
        assert [event.seq for event in events] == list(range(len(events)))
        assert events[-1].kind == "run_finished"
        state = await store.load(info.id)
        assert state.info.status == "completed"
        assert [e.kind for e in state.entries].count("tool_result") == 3


async def test_a_workers_run_joins_the_trace_of_the_request_that_enqueued_it(
    tmp_path: Path,
) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the telemetry tests need the otel extra")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent_flow.agent import AgentExecutor
    from agent_flow.telemetry import instrument

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def traced(agent: AgentExecutor) -> object:
        return instrument(agent, tracer_provider=provider, metrics=False)

    llm, tools = model_and_tools(tmp_path, None)
    async with on_sqlite(tmp_path, llm, tools, on_agent=traced) as (store, client):
        info = await store.create(agent="durable")
        with provider.get_tracer("caller").start_as_current_span("enqueue") as caller:
            handle = await client.enqueue(info.id, "count 1")
        await asyncio.wait_for(handle.outcome(), 60)
    spans = exporter.get_finished_spans()
    (agent_span,) = [span for span in spans if span.name.startswith("invoke_agent")]
    assert agent_span.context.trace_id == caller.get_span_context().trace_id
    assert agent_span.parent is not None
    assert agent_span.parent.span_id == caller.get_span_context().span_id
    provider.shutdown()


@pytest.mark.timeout(180)
async def test_sigkilled_workers_lose_no_run_and_repeat_no_tool_call(
    pg: tuple[str, str], workers: Workers, tmp_path: Path
) -> None:
    store_url, system_url = pg
    rng = random.Random(20261123)
    wanted = {index: rng.randint(2, 4) for index in range(20)}
    durable = DurableConfig(enabled=True, system_database_url=system_url, poll_seconds=0.1)
    async with open_store(store_url) as store, DurableClient(durable) as client:
        first = workers.start("w1", kill_at=rng.randint(5, 30))
        second = workers.start("w2", kill_at=rng.randint(20, 45))
        handles = []
        for count in wanted.values():
            info = await store.create(agent="durable")
            handles.append((await client.enqueue(info.id, f"count {count}"), count))
        await wait_dead(first, 60)
        await wait_dead(second, 60)
        assert first.returncode == second.returncode == -9  # both were SIGKILLed mid-work
        workers.start("w3")
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(handle.outcome() for handle, _ in handles)), 90
        )
        # w1 restarts under its old id: it finds nothing of its own left to run.
        workers.start("w1")
        await asyncio.sleep(2.0)
        interrupted = 0
        for (handle, count), outcome in zip(handles, outcomes, strict=True):
            assert outcome.final_text == "done", outcome
            assert len(outcome.tool_uses) == count
            executed = counts_of(tmp_path, handle.run_id)
            for n, use in enumerate(outcome.tool_uses, start=1):
                assert use.arguments == f'{{"n":{n}}}' or json.loads(use.arguments) == {"n": n}
                if use.error_kind == "interrupted":
                    # Running when a worker died: not idempotent, so never run again.
                    interrupted += 1
                    assert executed.count(n) <= 1, (handle, executed)
                else:
                    assert use.content == f"counted {n}"
                    assert executed.count(n) == 1, (handle, executed)
            events = await store.events(handle.session_id, run_id=handle.run_id)
            assert [event.seq for event in events] == list(range(len(events))), handle
            assert sum(event.kind == "run_finished" for event in events) == 1
        print(f"20 runs finished exactly once; {interrupted} tool call(s) interrupted by a kill")


async def test_a_durable_run_refuses_tools_that_need_approval(tmp_path: Path) -> None:
    from agent_flow.llm.base import LLMRequest
    from agent_flow.testing import FunctionLLM, Reply, call, reply
    from agent_flow.tools import ToolExecutor, ToolPolicy, tool

    ran: list[str] = []

    @tool(policy=ToolPolicy(requires_approval=True))
    def launch(target: str) -> str:
        """Launch something risky."""
        ran.append(target)
        return "launched"

    def play(request: LLMRequest) -> Reply:
        if not any(m.role == "tool" for m in request.messages):
            return reply(tool_calls=[call("launch", target="prod")])
        return reply("gave up")

    async with on_sqlite(tmp_path, FunctionLLM(play), ToolExecutor([launch])) as (store, client):
        info = await store.create(agent="durable")
        outcome = await asyncio.wait_for((await client.enqueue(info.id, "go")).outcome(), 60)
    assert ran == []
    [use] = outcome.tool_uses
    assert use.error_kind == "not_approved"
    assert "durable run" in use.content and "has no one to ask" in use.content
    assert outcome.final_text == "gave up"


async def test_a_sessions_runs_wait_in_the_queue_one_at_a_time_while_others_go_on(
    tmp_path: Path,
) -> None:
    # Each tool call takes 0.1 s: the first run of the session is surely in flight when the
    # second is enqueued. The queue is partitioned by session: the second waits in the queue
    # (not in a worker slot, on the session's claim), and another session's run goes on.
    llm, tools = model_and_tools(tmp_path, None, pause=0.1)
    async with on_sqlite(tmp_path, llm, tools) as (store, client):
        busy, other = await store.create(agent="durable"), await store.create(agent="durable")
        first = await client.enqueue(busy.id, "count 6")
        while not counts_of(tmp_path, first.run_id):  # noqa: ASYNC110 (a file, no event)
            await asyncio.sleep(0.02)
        second = await client.enqueue(busy.id, "count 1")
        third = await client.enqueue(other.id, "count 1")
        await asyncio.sleep(0.2)  # a few polls of the queue
        assert await second.state() == "queued"  # not dequeued to wait for the claim
        for handle in (first, second, third):
            assert (await asyncio.wait_for(handle.outcome(), 60)).final_text == "done"
        events = await store.events(busy.id)
        runs = [e.run_id for e in events if e.kind in ("run_started", "run_finished")]
        # Never interleaved: started, finished, started, finished, in enqueue order.
        assert runs == [first.run_id, first.run_id, second.run_id, second.run_id]
        ended = next(
            e.timestamp for e in events if e.kind == "run_finished" and e.run_id == first.run_id
        )
        started_other = next(
            e.timestamp for e in await store.events(other.id) if e.kind == "run_started"
        )
        assert started_other < ended  # the other session did not wait for the busy one


async def test_outcome_right_after_cancel_waits_for_the_run_to_stop(tmp_path: Path) -> None:
    from agent_flow.agent import StopReason

    llm, tools = model_and_tools(tmp_path, None, pause=0.1)
    async with on_sqlite(tmp_path, llm, tools) as (store, client):
        client.store = store  # the outcome of a cancelled run is read there
        info = await store.create(agent="durable")
        handle = await client.enqueue(info.id, "count 50")
        while not counts_of(tmp_path, handle.run_id):  # noqa: ASYNC110 (a file, no event)
            await asyncio.sleep(0.02)
        await handle.cancel()
        # DBOS says "cancelled" at once; the run is still stopping: not over yet.
        assert await handle.state() in ("running", "cancelled")
        outcome = await asyncio.wait_for(handle.outcome(), 60)
        assert outcome.stop_reason == StopReason.CANCELLED
        assert await handle.state() == "cancelled"
        assert 1 <= len(counts_of(tmp_path, handle.run_id)) < 50
