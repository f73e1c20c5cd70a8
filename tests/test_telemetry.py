"""OpenTelemetry GenAI spans and metrics of scripted runs, read from the SDK in memory."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_flow import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.errors import ModelConnectionError, UserError
from agent_flow.llm import OpenAIClient
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.telemetry import SEMCONV_VERSION, instrument
from agent_flow.telemetry._spans import provider_name
from agent_flow.testing import FunctionLLM, ScriptedReply, call, reply
from agent_flow.tools import tool
from tests.helpers import add, stdio_server
from tests.openai_server import OpenAIServer, sse_reply, text_chunks, tool_call_chunks

BASIC = stdio_server("basic", "basic_server.py")


@tool
def explode(reason: str) -> str:
    """Fail on purpose.

    Args:
        reason: Why.
    """
    raise RuntimeError(f"boom: {reason}")


@tool
async def slow_add(a: int, b: int) -> int:
    """Add two numbers, slowly.

    Args:
        a: One.
        b: The other.
    """
    await asyncio.sleep(0)
    return a + b


AGENT_USAGE = Usage(prompt_tokens=900, completion_tokens=60, cached_tokens=100)
SUMMARY_USAGE = Usage(prompt_tokens=1200, completion_tokens=30)


def _script(request: LLMRequest, turn: int) -> ScriptedReply:
    if turn == 1:  # two calls at once: siblings
        return reply(
            "adding both",
            tool_calls=[
                call("add", a=1, b=2, call_id="c1"),
                call("slow_add", a=3, b=4, call_id="c2"),
            ],
            usage=AGENT_USAGE,
        )
    if turn == 2:  # a tool that raises
        return reply(tool_calls=[call("explode", reason="test", call_id="c3")], usage=AGENT_USAGE)
    if turn < 17:  # long turns that make the history outgrow its budget
        return reply(
            "y " * 300,
            tool_calls=[call("add", a=turn, b=0, call_id=f"c{turn + 2}")],
            usage=AGENT_USAGE,
        )
    return reply("all done", usage=AGENT_USAGE)


def _agent() -> tuple[AgentExecutor, FunctionLLM]:
    turns = 0

    def answer(request: LLMRequest) -> ScriptedReply:
        nonlocal turns
        if not request.tools:  # the summarizer's request offers no tools
            return reply("- the agent added numbers", usage=SUMMARY_USAGE)
        turns += 1
        return _script(request, turns)

    llm = FunctionLLM(answer, model="gpt-4o-mini")
    context = ContextConfig(
        max_tokens=2500, reserve_output_tokens=200, counter="approx", strategy="summarize"
    )
    agent = AgentExecutor(llm, config=AgentConfig(name="adder", context=context))
    for extra in (add, slow_add, explode):
        agent.tools.register(extra)
    return agent, llm


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield spans, provider
    provider.shutdown()


_PHASE = {"agent": 0, "tool": 1, "summarizer": 2}


def _order(span: ReadableSpan) -> tuple[int, int, str]:
    attributes = span.attributes or {}
    phase = (
        "tool"
        if span.name.startswith("execute_tool")
        else attributes.get("agent_flow.model_call.source", "agent")
    )
    return (
        int(attributes.get("agent_flow.iteration", 0)),  # type: ignore[call-overload]
        _PHASE[str(phase)],
        str(attributes.get("gen_ai.tool.call.id", "")),
    )


def _tree(spans: list[ReadableSpan]) -> list[Any]:
    """Every root with its children, ordered as the loop ran them: [name, [children]]."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent, []).append(span)

    def node(span: ReadableSpan) -> Any:
        below = sorted(children.get(span.context.span_id, []), key=_order)
        return [span.name, [node(child) for child in below]] if below else span.name

    return [node(root) for root in children[None]]


def _by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def test_a_run_is_an_exact_genai_span_tree(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = exporter
    agent, _ = _agent()
    instrument(agent, tracer_provider=provider, metrics=False)
    outcome = await agent.run("add numbers")
    finished = list(spans.get_finished_spans())

    # 17 model calls, each with its tools; after iteration 13 the history outgrew its budget
    # and the summarizer made one call while pruning.
    assert outcome.iterations == 17
    expected: list[Any] = []
    for iteration in range(1, 18):
        expected.append("chat gpt-4o-mini")
        if iteration == 1:
            expected += ["execute_tool add", "execute_tool slow_add"]
        elif iteration == 2:
            expected.append("execute_tool explode")
        elif iteration < 17:
            expected.append("execute_tool add")
        if iteration == 13:
            expected.append("chat gpt-4o-mini")  # the summarizer's
    assert _tree(finished) == [["invoke_agent adder", expected]]


async def test_spans_carry_the_conventions_attributes_and_the_budget_story(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = exporter
    agent, _ = _agent()
    instrument(agent, tracer_provider=provider, metrics=False)
    built: list[Any] = []
    agent.events.on("context_built", built.append)
    outcome = await agent.run("add numbers")
    finished = list(spans.get_finished_spans())
    (run,) = _by_name(finished, "invoke_agent adder")
    chats = _by_name(finished, "chat gpt-4o-mini")
    (summary,) = [s for s in chats if s.attributes["agent_flow.model_call.source"] == "summarizer"]
    calls = [s for s in chats if s is not summary]

    assert run.attributes is not None
    assert {k: run.attributes[k] for k in run.attributes if k != "gen_ai.conversation.id"} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "adder",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.provider.name": "_OTHER",
        "agent_flow.run.id": outcome.run_id,
        "gen_ai.usage.input_tokens": outcome.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": outcome.usage.completion_tokens,
        "agent_flow.stop_reason": "answered",
        "agent_flow.iterations": 17,
        "agent_flow.cost_usd": pytest.approx(outcome.cost_usd),
    }
    assert run.status.status_code is StatusCode.UNSET

    first = calls[0]
    assert first.kind.name == "CLIENT"
    assert first.attributes is not None
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert first.attributes["gen_ai.response.model"] == "gpt-4o-mini"
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert first.attributes["gen_ai.usage.input_tokens"] == 900
    assert first.attributes["gen_ai.usage.output_tokens"] == 60
    assert first.attributes["gen_ai.usage.cache_read.input_tokens"] == 100
    assert first.attributes["agent_flow.model_call.tool_calls"] == 2
    assert first.attributes["agent_flow.cost_usd"] == pytest.approx(outcome.cost_per_call[0])
    # The prompt's breakdown, section by section, as the ContextBuilt event told it.
    for key, value in built[0].breakdown.model_dump().items():
        assert first.attributes[f"agent_flow.prompt.{key}"] == value
    assert calls[-1].attributes["gen_ai.response.finish_reasons"] == ("stop",)  # type: ignore[index]
    assert summary.attributes is not None
    assert summary.attributes["gen_ai.usage.input_tokens"] == 1200
    assert summary.attributes["agent_flow.iteration"] == 13
    # The run's cost sums every call's, the summarizer's included.
    costs = [float(s.attributes["agent_flow.cost_usd"]) for s in chats]  # type: ignore[index,arg-type]
    assert len(costs) == len(outcome.cost_per_call) == 18
    assert sum(costs) == pytest.approx(outcome.cost_usd)

    tools = {
        s.attributes["gen_ai.tool.call.id"]: s
        for s in finished
        if s.attributes and "gen_ai.tool.call.id" in s.attributes
    }
    parallel = [tools["c1"], tools["c2"]]
    assert {s.parent.span_id for s in parallel if s.parent} == {run.context.span_id}
    for span in parallel:
        assert span.attributes is not None
        assert span.attributes["gen_ai.tool.type"] == "function"
        assert "error.type" not in span.attributes
        assert span.start_time is not None
        assert calls[1].start_time is not None
        assert span.start_time < calls[1].start_time
    failing = tools["c3"]
    assert failing.attributes is not None
    assert failing.attributes["gen_ai.tool.name"] == "explode"
    assert failing.attributes["error.type"] == "exception"
    assert failing.status.status_code is StatusCode.ERROR

    events = {event.name: event for event in run.events}
    pruned = events["agent_flow.history.pruned"].attributes
    assert pruned is not None
    assert pruned["agent_flow.prune.summarized"] > 0
    assert pruned["agent_flow.prune.fits"] is True
    assert pruned["agent_flow.prune.tokens_after"] < pruned["agent_flow.prune.tokens_before"]
    updated = [e.attributes for e in run.events if e.name == "agent_flow.environment.updated"]
    assert updated[0] == {
        "agent_flow.environment.source": "add, slow_add",
        "agent_flow.environment.version": updated[0]["agent_flow.environment.version"],
        "agent_flow.environment.pointers": (
            "/extensions/tool_results/add",
            "/extensions/tool_results/slow_add",
        ),
        "agent_flow.environment.ops": ("set", "set"),
    }

    # No message contents unless asked for.
    for span in finished:
        assert span.attributes is not None
        assert not {
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        } & set(span.attributes)


async def test_message_contents_are_recorded_only_when_asked_for(
    exporter: tuple[InMemorySpanExporter, TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    spans, provider = exporter
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    llm = FunctionLLM(
        lambda r: (
            reply("the sum is 3")
            if len(r.messages) > 2
            else reply(tool_calls=[call("add", a=1, b=2, call_id="k1")])
        )
    )
    agent = AgentExecutor(llm, config=AgentConfig(context=ContextConfig(counter="approx")))
    agent.tools.register(add)
    instrument(agent, tracer_provider=provider, metrics=False)
    await agent.run("add 1 and 2")
    finished = list(spans.get_finished_spans())
    (run,) = [s for s in finished if s.name.startswith("invoke_agent")]
    assert run.attributes is not None
    assert json.loads(str(run.attributes["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "add 1 and 2"}]}
    ]
    (tool_span,) = [s for s in finished if s.name == "execute_tool add"]
    assert tool_span.attributes is not None
    assert json.loads(str(tool_span.attributes["gen_ai.tool.call.arguments"])) == {"a": 1, "b": 2}
    assert tool_span.attributes["gen_ai.tool.call.result"] == "3"
    last_chat = [s for s in finished if s.name.startswith("chat")][-1]
    assert last_chat.attributes is not None
    assert json.loads(str(last_chat.attributes["gen_ai.output.messages"]))[0]["parts"] == [
        {"type": "text", "content": "the sum is 3"}
    ]


def test_the_provider_is_named_from_the_server() -> None:
    assert provider_name("https://api.openai.com/v1") == "openai"
    assert provider_name("https://x.openai.azure.com/openai") == "azure.ai.openai"
    assert provider_name("http://127.0.0.1:11434/v1") == "_OTHER"
    assert provider_name(None) == "_OTHER"
    assert SEMCONV_VERSION == "1.44.0"


async def test_mcp_tools_and_the_server_are_marked_and_the_api_key_never_appears(
    exporter: tuple[InMemorySpanExporter, TracerProvider], openai_server: OpenAIServer
) -> None:
    spans, provider = exporter
    secret = "sk-telemetry-secret-4242"
    openai_server.script(
        sse_reply(tool_call_chunks([("m1", "basic_add", '{"a": 2, "b": 3}')])),
        sse_reply(text_chunks("5")),
    )
    client = OpenAIClient("gpt-4o-mini", base_url=openai_server.base_url, api_key=secret)
    config = AgentConfig(context=ContextConfig(counter="approx"), mcp_servers=(BASIC,))
    async with AgentExecutor(client, config=config) as agent:
        instrument(agent, tracer_provider=provider, metrics=False, capture_content=True)
        outcome = await agent.run("add 2 and 3")
    await client.aclose()
    assert outcome.final_text == "5"
    finished = list(spans.get_finished_spans())
    (tool_span,) = [s for s in finished if s.name == "execute_tool basic_add"]
    assert tool_span.attributes is not None
    assert tool_span.attributes["gen_ai.tool.type"] == "extension"
    assert tool_span.attributes["agent_flow.tool.mcp"] is True
    assert tool_span.attributes["agent_flow.tool.mcp.server"] == "basic"
    port = int(openai_server.base_url.split(":")[2].split("/")[0])
    for span in finished:
        assert span.attributes is not None
        if not span.name.startswith("execute_tool"):
            assert span.attributes["server.address"] == "127.0.0.1"
            assert span.attributes["server.port"] == port
        dumped = json.dumps({**span.attributes}, default=str)
        dumped += json.dumps([{**(e.attributes or {})} for e in span.events], default=str)
        assert secret not in dumped


async def test_metrics_follow_the_conventions_and_the_budget(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    _, provider = exporter
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    agent, _ = _agent()
    instrument(agent, tracer_provider=provider, meter_provider=meters)
    outcome = await agent.run("add numbers")
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    meters.shutdown()

    usage = {p.attributes["gen_ai.token.type"]: p for p in points["gen_ai.client.token.usage"]}
    assert usage["input"].sum == outcome.usage.prompt_tokens
    assert usage["output"].sum == outcome.usage.completion_tokens
    assert usage["input"].count == 18  # 17 agent calls and the summarizer's
    durations = {
        p.attributes["gen_ai.operation.name"]: p for p in points["gen_ai.client.operation.duration"]
    }
    assert durations["chat"].count == 18
    assert durations["invoke_agent"].count == 1
    sections = {
        p.attributes["agent_flow.prompt.section"]: p
        for p in points["agent_flow.context.utilization"]
    }
    assert set(sections) == {
        "system_template",
        "environment",
        "tools",
        "history",
        "priming",
        "reserve",
        "total",
    }
    assert all(p.count == 17 for p in sections.values())
    assert 0 < sections["total"].max <= 1
    actions = {
        p.attributes["agent_flow.history.prune_action"]
        for p in points["agent_flow.history.pruned_entries"]
    }
    assert "summarized" in actions
    assert points["agent_flow.history.pruned_tokens"][0].value > 0
    assert points["agent_flow.cost"][0].value == pytest.approx(outcome.cost_usd)


def test_the_core_never_loads_opentelemetry_or_the_price_data_on_import() -> None:
    code = (
        "import sys\n"
        "import agent_flow, agent_flow.agent, agent_flow.cli\n"
        "ring = [m for m in sys.modules if m.startswith('agent_flow.telemetry')]\n"
        "assert not ring, ring\n"
        "import agent_flow.telemetry\n"
        "loaded = [m for m in sys.modules if m.startswith(('opentelemetry', 'genai_prices'))]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_instrumenting_without_the_api_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent, _ = _agent()
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with pytest.raises(UserError, match=r"pip install 'agent-flow\[otel\]'"):
        instrument(agent)


async def test_a_run_started_under_a_span_is_its_child(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = exporter
    agent = AgentExecutor(
        FunctionLLM(lambda r: reply("hi")),
        config=AgentConfig(context=ContextConfig(counter="approx")),
    )
    instrument(agent, tracer_provider=provider, metrics=False)
    # The caller's context (a request's span, or one extracted from a traceparent header) is
    # the run's parent: the trace goes on across the service into the agent.
    with provider.get_tracer("caller").start_as_current_span("POST /runs") as request:
        await agent.run("x")
    (run,) = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert run.parent is not None
    assert run.parent.span_id == request.get_span_context().span_id
    assert run.context.trace_id == request.get_span_context().trace_id


async def test_a_retried_model_call_is_a_failed_chat_span_then_another(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = exporter
    attempts = 0

    def flaky(request: LLMRequest) -> ScriptedReply:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ModelConnectionError("the connection dropped mid-answer")
        return reply("hi")

    agent = AgentExecutor(
        FunctionLLM(flaky, model="m"), config=AgentConfig(context=ContextConfig(counter="approx"))
    )
    instrument(agent, tracer_provider=provider, metrics=False)
    outcome = await agent.run("x")
    assert outcome.final_text == "hi"
    finished = list(spans.get_finished_spans())
    assert _tree(finished) == [["invoke_agent agent", ["chat m", "chat m"]]]
    failed, retried = sorted(
        (s for s in finished if s.name == "chat m"), key=lambda s: s.start_time or 0
    )
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == "ModelConnectionError"
    assert failed.status.status_code is StatusCode.ERROR
    assert retried.attributes is not None
    assert "error.type" not in retried.attributes
    assert retried.attributes["gen_ai.response.finish_reasons"] == ("stop",)
