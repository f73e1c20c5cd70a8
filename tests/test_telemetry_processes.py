"""`agent-flow serve --otel` and `agent-flow worker --otel`, exporting to a real OTLP receiver.

Real processes: the server and the worker talk to the scripted OpenAI server over HTTP and
export over OTLP/HTTP to `tests.otlp_receiver` on loopback, which decodes the protobuf. What
holds for every run of a session: the session is the conversation, each run has its own id,
and the run's trace is the caller's when the caller sent one (a request's ``traceparent``, or
the carrier a durable run was enqueued with).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

import httpx2
from opentelemetry.sdk.trace import TracerProvider

from tests.openai_server import OpenAIServer, sse_reply, text_chunks, tool_call_chunks
from tests.otlp_receiver import OTLPReceiver, Span
from tests.server_harness import free_port, serve_command, stream

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def _env(receiver: OTLPReceiver) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_"))}
    return {
        **kept,
        "TELEMETRY_TEST_KEY": "sk-telemetry-test",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "telemetry-processes",
        # Export within a tenth of a second instead of five: the test waits on the receiver.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }


def _config(tmp_path: Path, openai_server: OpenAIServer, extra: str = "") -> Path:
    config = tmp_path / "agent.toml"
    config.write_text(
        "[agent]\nname = 'traced'\n[agent.llm]\n"
        f"model = 'gpt-4o-mini'\nbase_url = '{openai_server.base_url}'\n"
        "api_key_env = 'TELEMETRY_TEST_KEY'\n[agent.context]\ncounter = 'approx'\n" + extra
    )
    return config


@contextmanager
def _process(command: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        assert process.stderr is not None
        process.stderr.readline()  # its banner: serving, or executing runs
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # flushes its exporter on the way out
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()


def _runs(spans: list[Span]) -> list[Span]:
    return sorted((s for s in spans if s.name.startswith("invoke_agent")), key=lambda s: s.start_ns)


def _children(spans: list[Span], run: Span) -> list[str]:
    return sorted(s.name for s in spans if s.parent_id == run.span_id)


async def test_a_served_sessions_runs_are_one_conversation_each_in_its_callers_trace(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:
    openai_server.script(
        sse_reply(text_chunks("first answer")),
        sse_reply(text_chunks("second answer")),
    )
    port = free_port()
    command = [*serve_command(str(_config(tmp_path, openai_server)), str(tmp_path / "s.db"), port)]
    with OTLPReceiver() as receiver, _process([*command, "--otel"], _env(receiver)):
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(400):
                try:
                    created = await client.post("/sessions", json={})
                    break
                except httpx2.ConnectError:
                    await asyncio.sleep(0.025)  # it binds right after its banner
            sid = created.json()["id"]
            runs = []
            for message, headers in (
                ("first", {}),
                ("second", {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}),
            ):
                async with stream(client, f"/sessions/{sid}/events") as events:
                    sent = await client.post(
                        f"/sessions/{sid}/messages", json={"message": message}, headers=headers
                    )
                    assert sent.status_code == 202, sent.text
                    runs.append(sent.json()["run_id"])
                    await events.until("run_finished")
        await asyncio.to_thread(receiver.wait_for, lambda r: len(_runs(r.spans())) == 2)
        spans = receiver.spans()

    first, second = _runs(spans)
    assert [first.attributes["agent_flow.run.id"], second.attributes["agent_flow.run.id"]] == runs
    for run in (first, second):
        assert run.attributes["gen_ai.conversation.id"] == sid
        assert run.resource["service.name"] == "telemetry-processes"
        (chat,) = [s for s in spans if s.parent_id == run.span_id]
        assert chat.name == "chat gpt-4o-mini"
        assert chat.attributes["gen_ai.conversation.id"] == sid
        assert chat.trace_id == run.trace_id
    # Each run is part of its request's trace (FastAPI traces its requests itself): the
    # first request brought no context, the second a traceparent, which the run continues.
    by_id = {span.span_id: span for span in spans}

    def request_of(run: Span) -> Span:
        span = run
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
        return span

    assert (
        request_of(first).name
        == request_of(second).name
        == ("POST /sessions/{session_id}/messages")
    )
    assert request_of(first).parent_id == "" and first.trace_id != TRACE_ID
    assert (second.trace_id, request_of(second).parent_id) == (TRACE_ID, PARENT_ID)
    raw = b"".join(body for _, body in receiver.raw)
    assert b"sk-telemetry-test" not in raw
    assert b"first answer" not in raw  # no contents unless asked for


async def test_a_workers_durable_run_is_in_the_enqueuers_trace_and_its_sessions_conversation(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:
    pytest.importorskip("dbos", reason="the durable tests need the 'durable' extra")
    from agent_flow.durable import DurableClient, load_durable_config
    from agent_flow.sessions import open_store

    openai_server.script(
        sse_reply(tool_call_chunks([("c1", "task_completion", '{"summary": "done"}')])),
    )
    system = f"sqlite:///{tmp_path}/dbos.sqlite"
    config = _config(
        tmp_path,
        openai_server,
        f"[durable]\nenabled = true\nsystem_database_url = '{system}'\npoll_seconds = 0.05\n",
    )
    db = tmp_path / "s.db"
    worker = [
        sys.executable, "-m", "agent_flow.cli", "worker", "--config", str(config), "--db", str(db),
        "--otel",
    ]  # fmt: skip
    enqueuer = TracerProvider()
    with OTLPReceiver() as receiver, _process(worker, _env(receiver)):
        durable = load_durable_config(config)
        async with open_store(str(db)) as store:
            info = await store.create(agent="traced")
            async with DurableClient(durable, store) as client:
                # Enqueued under a span of the enqueuer: the run continues its trace.
                with enqueuer.get_tracer("enqueuer").start_as_current_span("enqueue") as span:
                    handle = await client.enqueue(info.id, "finish at once")
                    parent = span.get_span_context()
                outcome = await asyncio.wait_for(handle.outcome(), 60)
        await asyncio.to_thread(receiver.wait_for, lambda r: len(_runs(r.spans())) == 1)
        spans = receiver.spans()
    enqueuer.shutdown()

    assert outcome.stop_reason == "completed"
    (run,) = _runs(spans)
    assert run.trace_id == f"{parent.trace_id:032x}"
    assert run.parent_id == f"{parent.span_id:016x}"
    assert run.attributes["gen_ai.conversation.id"] == info.id
    assert run.attributes["agent_flow.run.id"] == outcome.run_id
    assert _children(spans, run) == ["chat gpt-4o-mini", "execute_tool task_completion"]
