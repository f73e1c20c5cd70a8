"""OpenTelemetry GenAI spans and metrics of scripted runs, read from the SDK in memory."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
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
from agent_flow.llm.observers import MODEL_CALL_OBSERVERS
from agent_flow.telemetry import instrument
from agent_flow.telemetry._providers import PROVIDERS, provider_name
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
    budget_story = {k for k in run.attributes if k.startswith("agent_flow.prompt.")}
    assert budget_story == {
        "agent_flow.prompt.budget",
        "agent_flow.prompt.reserve",
        "agent_flow.prompt.priming",
    }
    assert {k: run.attributes[k] for k in set(run.attributes) - budget_story} == {
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
    # The prompt's breakdown, section by section, as the ContextBuilt event told it: what
    # stays fixed in a run (budget, reserve, priming) on the run's span, the rest on each call.
    steady = {"budget", "reserve", "priming"}
    for chat, event in zip(calls, built, strict=True):
        assert chat.attributes is not None
        for key, value in event.breakdown.model_dump().items():
            holder = run.attributes if key in steady else chat.attributes
            assert holder[f"agent_flow.prompt.{key}"] == value, key
        assert not steady & {k.removeprefix("agent_flow.prompt.") for k in chat.attributes}
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


# Each provider the conventions name, with a base URL of its OpenAI-compatible API.
KNOWN_URLS = {
    "https://api.openai.com/v1": "openai",
    "https://my-team.openai.azure.com/openai/v1/": "azure.ai.openai",
    "https://east.cognitiveservices.azure.com/openai/v1": "azure.ai.openai",
    "https://models.inference.ai.azure.com": "azure.ai.inference",
    "https://proj.services.ai.azure.com/models": "azure.ai.inference",
    "https://api.anthropic.com/v1/": "anthropic",
    "https://generativelanguage.googleapis.com/v1beta/openai/": "gcp.gemini",
    "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/l/endpoints/openapi": (
        "gcp.vertex_ai"
    ),
    "https://aiplatform.googleapis.com/v1/projects/p/locations/global/endpoints/openapi": (
        "gcp.vertex_ai"
    ),
    "https://api.cohere.ai/compatibility/v1": "cohere",
    "https://api.cohere.com/compatibility/v1": "cohere",
    "https://us-south.ml.cloud.ibm.com/ml/gateway/v1": "ibm.watsonx.ai",
    "https://bedrock-runtime.us-west-2.amazonaws.com/openai/v1": "aws.bedrock",
    "https://api.mistral.ai/v1": "mistral_ai",
    "https://api.groq.com/openai/v1": "groq",
    "https://api.deepseek.com": "deepseek",
    "https://api.x.ai/v1": "x_ai",
    "https://api.perplexity.ai": "perplexity",
    "HTTPS://API.OPENAI.COM./v1": "openai",  # hosts are case-insensitive, a final dot is root
}


def test_every_provider_the_conventions_name_is_recognized_by_its_host() -> None:
    for url, name in KNOWN_URLS.items():
        assert provider_name(url) == name, url
    assert (
        set(KNOWN_URLS.values())
        == set(PROVIDERS)
        == _conventions_providers()
        - {
            "gcp.gen_ai"  # "any Google endpoint": never a better answer than the two above
        }
    )
    for url in (
        None,
        "",
        "http://127.0.0.1:11434/v1",
        "https://notanthropic.com/v1",
        "https://anthropic.com.evil.example/v1",
        "https://api.openai.com.example.net/v1",
        "https://openai.azure.com/",  # the domain itself is no resource
        "https://api.openai.co/v1",
        "https://bedrock-runtime.amazonaws.com.example.org/",
        "http://[::1]:8000/v1",
        "not a url",
    ):
        assert provider_name(url) == "_OTHER", url


def _conventions_providers() -> set[str]:
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes

    return {member.value for member in gen_ai_attributes.GenAiProviderNameValues}


_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)


@given(
    known=st.sampled_from(sorted(KNOWN_URLS)),
    before=_LABEL,
    after=st.lists(_LABEL, min_size=1, max_size=2).map(".".join),
)
def test_a_host_that_merely_contains_a_providers_host_is_not_that_provider(
    known: str, before: str, after: str
) -> None:
    provider = KNOWN_URLS[known]
    host = (urlsplit(known).hostname or "").rstrip(".")
    # A domain after the provider's host: someone else's host.
    assert provider_name(f"https://{host}.{after}/v1") == "_OTHER"
    # Text glued before it: the same provider only where its hosts are patterns (a resource
    # or region label), never by containing the name ("notanthropic.com").
    glued = provider_name(f"https://{before}{host}/v1")
    assert glued in {"_OTHER", provider}
    if glued == provider:
        assert any("*" in pattern for pattern in PROVIDERS[provider])


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
    # Every prompt's varying shares; the steady ones once, as they never changed.
    assert {name: p.count for name, p in sections.items()} == {
        "environment": 17,
        "tools": 17,
        "history": 17,
        "total": 17,
        "system_template": 1,
        "priming": 1,
        "reserve": 1,
    }
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


async def test_a_retried_model_call_is_one_chat_span_with_an_event_per_failed_attempt(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    # A client without a retry layer of its own: the agent's loop tries again. The span
    # covers the logical call with all its attempts, as the conventions ask.
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
    assert _tree(finished) == [["invoke_agent agent", ["chat m"]]]
    (chat,) = _by_name(finished, "chat m")
    assert chat.attributes is not None
    assert "error.type" not in chat.attributes
    assert chat.status.status_code is StatusCode.UNSET
    assert chat.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert chat.attributes["agent_flow.model_call.attempts"] == 2
    (retry,) = chat.events
    assert retry.name == "agent_flow.model_call.retry"
    assert dict(retry.attributes or {}) == {
        "agent_flow.retry.attempt": 1,
        "agent_flow.retry.max_attempts": agent.config.model_retries + 1,
        "agent_flow.retry.delay": 0.0,
        "error.type": "ModelConnectionError",
    }


# -- each span is current while its operation runs ---------------------------------------------


async def test_what_a_model_call_or_a_tool_traces_is_a_child_of_its_span(
    exporter: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    # Stand-ins for instrumented libraries (an HTTP client under the model, an MCP client
    # under a tool): each starts a span under whatever span is current, in its own thread
    # for the sync tool (which runs in a worker thread).
    spans, provider = exporter
    library = provider.get_tracer("library")

    @tool
    def sync_fetch(url: str) -> str:
        """Fetch, blocking.

        Args:
            url: Where.
        """
        with library.start_as_current_span("GET sync"):
            return "ok"

    @tool
    async def async_fetch(url: str) -> str:
        """Fetch, async.

        Args:
            url: Where.
        """
        with library.start_as_current_span("GET async"):
            await asyncio.sleep(0)
            return "ok"

    def model(request: LLMRequest) -> ScriptedReply:
        with library.start_as_current_span("POST /chat/completions"):
            pass
        if len(request.messages) > 2:
            return reply("done")
        return reply(
            tool_calls=[
                call("sync_fetch", url="a", call_id="s1"),
                call("async_fetch", url="b", call_id="a1"),
            ]
        )

    agent = AgentExecutor(
        FunctionLLM(model, model="m"), config=AgentConfig(context=ContextConfig(counter="approx"))
    )
    agent.tools.register(sync_fetch)
    agent.tools.register(async_fetch)
    instrument(agent, tracer_provider=provider, metrics=False)
    await agent.run("fetch both")

    finished = list(spans.get_finished_spans())
    by_id = {span.context.span_id: span for span in finished}

    def parent_of(name: str) -> list[str]:
        return [by_id[s.parent.span_id].name for s in finished if s.name == name and s.parent]

    assert parent_of("GET sync") == ["execute_tool sync_fetch"]
    assert parent_of("GET async") == ["execute_tool async_fetch"]
    assert parent_of("POST /chat/completions") == ["chat m", "chat m"]
    assert len({s.context.trace_id for s in finished}) == 1


_ENDINGS = ("answered", "tool_raised", "model_failed", "cancelled", "task_cancelled")


@settings(max_examples=20)
@given(endings=st.lists(st.sampled_from(_ENDINGS), min_size=1, max_size=4))
async def test_after_any_run_the_callers_context_is_as_it_was(endings: list[str]) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    detach_failures: list[logging.LogRecord] = []
    handler = _ListHandler(detach_failures)
    logging.getLogger("opentelemetry.context").addHandler(handler)
    try:
        with provider.get_tracer("caller").start_as_current_span("caller") as caller:
            for ending in endings:
                await _one_run(provider, ending)
                assert trace.get_current_span() is caller
                assert MODEL_CALL_OBSERVERS.get() == ()
        assert not trace.get_current_span().get_span_context().is_valid
    finally:
        logging.getLogger("opentelemetry.context").removeHandler(handler)
        provider.shutdown()
    assert detach_failures == []
    runs = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert len(runs) == len(endings)
    # Every span ended, inside its run.
    for span in spans.get_finished_spans():
        assert span.end_time is not None


class _ListHandler(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


async def _one_run(provider: TracerProvider, ending: str) -> None:
    started = asyncio.Event()
    holder: list[AgentExecutor] = []

    @tool
    async def work(step: int) -> str:
        """Do a step.

        Args:
            step: Which.
        """
        if ending == "tool_raised":
            raise RuntimeError("no")
        if ending == "cancelled":
            holder[0].cancel()
        if ending == "task_cancelled":
            started.set()
            await asyncio.Event().wait()
        return "ok"

    def model(request: LLMRequest) -> ScriptedReply:
        if ending == "model_failed":
            raise ModelConnectionError("gone")
        if len(request.messages) > 2:
            return reply("done")
        return reply(tool_calls=[call("work", step=1)])

    agent = AgentExecutor(
        FunctionLLM(model, model="m"),
        config=AgentConfig(context=ContextConfig(counter="approx"), model_retries=0),
    )
    holder.append(agent)
    agent.tools.register(work)
    instrument(agent, tracer_provider=provider)
    if ending != "task_cancelled":
        await agent.run("go")
        return
    running = asyncio.create_task(agent.run("go"))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
