"""A trace carried across a boundary: an HTTP request into its run, a process into another."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server tests need the 'server' extra")

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.llm.base import LLMClient
from agent_flow.server import create_app
from agent_flow.sessions import InMemorySessionStore
from agent_flow.telemetry import instrument
from agent_flow.telemetry.propagation import attached_context, inject_context
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import ToolExecutor
from tests.helpers import add
from tests.server_harness import serving, stream

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield spans, provider
    provider.shutdown()


def _model(config: AgentConfig) -> LLMClient:
    return ScriptedLLM([reply(tool_calls=[call("add", a=1, b=2)]), reply("3")])


def _tools(config: AgentConfig) -> ToolExecutor:
    executor = ToolExecutor()
    executor.register(add)
    return executor


async def _run_over_http(
    provider: TracerProvider, headers: dict[str, str], *, server_span: bool = False
) -> None:
    """Create a session and run it by one POST message (202 at once; the run goes on)."""
    app: Any = create_app(
        AgentConfig(context=ContextConfig(counter="approx")),
        store=InMemorySessionStore(),
        llm_factory=_model,
        tools_factory=_tools,
        on_agent=functools.partial(instrument, tracer_provider=provider, metrics=False),
    )
    if server_span:
        app = _server_spans(app, provider)
    async with serving(app) as client:
        created = await client.post("/sessions", json={})
        sid = created.json()["id"]
        async with stream(client, f"/sessions/{sid}/events") as events:
            sent = await client.post(
                f"/sessions/{sid}/messages", json={"message": "add"}, headers=headers
            )
            assert sent.status_code == 202, sent.text
            await events.until("run_finished")


def _server_spans(app: Any, provider: TracerProvider) -> Any:
    """What an OpenTelemetry ASGI middleware does: each request in a current server span."""
    tracer = provider.get_tracer("asgi")

    async def traced(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)  # type: ignore[no-any-return]
        headers = {key.decode(): value.decode() for key, value in scope["headers"]}
        name = f"{scope['method']} {scope['path']}"
        with tracer.start_as_current_span(name, context=propagate.extract(headers)):
            await app(scope, receive, send)
        return None

    return traced


def _invoke(spans: list[ReadableSpan]) -> ReadableSpan:
    [run] = [span for span in spans if span.name.startswith("invoke_agent")]
    return run


async def test_a_request_with_a_traceparent_makes_the_run_a_child_of_the_callers_span(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = exporter
    await _run_over_http(provider, {"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    finished = list(spans.get_finished_spans())
    run = _invoke(finished)
    assert run.parent is not None and run.parent.is_remote
    assert (run.parent.trace_id, run.parent.span_id) == (TRACE_ID, PARENT_ID)
    assert run.context.trace_state.get("vendor") == "1"
    # The whole run is in the caller's trace: its model calls and its tool call too.
    assert sorted(span.name.split()[0] for span in finished) == [
        "chat",
        "chat",
        "execute_tool",
        "invoke_agent",
    ]
    assert {span.context.trace_id for span in finished} == {TRACE_ID}
    assert all(
        span.parent is not None and span.parent.span_id == run.context.span_id
        for span in finished
        if span is not run
    )


async def test_a_request_without_one_starts_a_trace_of_its_own(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = exporter
    await _run_over_http(provider, {})
    run = _invoke(list(spans.get_finished_spans()))
    assert run.parent is None
    assert run.context.trace_id != TRACE_ID


async def test_under_a_server_span_the_run_is_its_child(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = exporter
    await _run_over_http(provider, {"traceparent": TRACEPARENT}, server_span=True)
    finished = list(spans.get_finished_spans())
    [post] = [span for span in finished if span.name.startswith("POST /sessions/")]
    run = _invoke(finished)
    assert post.parent is not None and post.parent.span_id == PARENT_ID  # the middleware's
    assert run.parent is not None and run.parent.span_id == post.context.span_id
    assert run.context.trace_id == TRACE_ID


# In another process: attach the carrier read from stdin, run a scripted agent under it,
# print the run span's trace id and parent span id.
_WORKER = """
import asyncio, json, sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from agent_flow import AgentExecutor
from agent_flow.telemetry import instrument
from agent_flow.telemetry.propagation import attached_context
from agent_flow.testing import ScriptedLLM, reply

async def main():
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    agent = AgentExecutor(ScriptedLLM([reply("done")]))
    instrument(agent, tracer_provider=provider, metrics=False)
    with attached_context(json.loads(sys.stdin.read())):
        await agent.run("queued task")
    [run] = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    print(json.dumps([run.context.trace_id, run.parent.span_id, run.parent.is_remote]))

asyncio.run(main())
"""


def test_a_carrier_serialized_to_another_process_keeps_the_trace_and_the_parent(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    _, provider = exporter
    with provider.get_tracer("test").start_as_current_span("enqueue") as enqueue:
        carrier = inject_context()
    assert set(carrier) == {"traceparent"}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER],
        input=json.dumps(carrier),
        capture_output=True,
        text=True,
        check=True,
    )
    trace_id, parent_id, remote = json.loads(done.stdout)
    assert trace_id == enqueue.get_span_context().trace_id
    assert parent_id == enqueue.get_span_context().span_id
    assert remote is True


@given(
    trace_id=st.integers(min_value=1, max_value=2**128 - 1),
    span_id=st.integers(min_value=1, max_value=2**64 - 1),
    sampled=st.booleans(),
)
def test_inject_then_attach_through_json_restores_the_span_context(
    trace_id: int, span_id: int, sampled: bool
) -> None:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    span = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags))
    token = context.attach(trace.set_span_in_context(span))
    try:
        carrier: dict[str, Any] = json.loads(json.dumps(inject_context()))
    finally:
        context.detach(token)
    assert not trace.get_current_span().get_span_context().is_valid
    with attached_context(carrier):
        restored = trace.get_current_span().get_span_context()
        assert (restored.trace_id, restored.span_id) == (trace_id, span_id)
        assert restored.trace_flags.sampled is sampled and restored.is_remote
    assert not trace.get_current_span().get_span_context().is_valid


def test_without_opentelemetry_a_carrier_is_empty_and_attaching_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    assert inject_context() == {}
    with attached_context({"traceparent": TRACEPARENT}):
        pass
    with attached_context(None):
        pass
