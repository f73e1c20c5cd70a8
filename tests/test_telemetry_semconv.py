"""The names the telemetry ring emits are the GenAI semantic conventions' own, in one version."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.schemas import Schemas

from agent_flow import AgentExecutor
from agent_flow.llm.base import Usage
from agent_flow.telemetry import SEMCONV_VERSION, instrument
from agent_flow.telemetry import _names as n
from agent_flow.testing import ScriptedLLM, call, reply
from tests.helpers import add


def _defined(module: object) -> set[str]:
    return {
        value for name, value in vars(module).items() if name.isupper() and isinstance(value, str)
    }


def test_every_gen_ai_name_is_defined_by_the_conventions_and_the_version_exists() -> None:
    ours = {v for k, v in vars(n).items() if k.isupper() and isinstance(v, str)}
    attributes = {name for name in ours if name.startswith("gen_ai.") and "client" not in name}
    assert attributes and attributes <= _defined(gen_ai_attributes)
    metrics = {n.TOKEN_USAGE_METRIC, n.DURATION_METRIC, n.TIME_TO_FIRST_CHUNK_METRIC}
    assert metrics <= _defined(gen_ai_metrics)
    assert n.SEMCONV_SCHEMA_URL in {schema.value for schema in Schemas}
    assert n.SEMCONV_SCHEMA_URL.endswith(SEMCONV_VERSION)


async def _span_attributes() -> list[tuple[str, dict[str, object]]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    usage = Usage(prompt_tokens=10, completion_tokens=2)
    agent = AgentExecutor(
        ScriptedLLM(
            [reply(tool_calls=[call("add", a=1, b=2)], usage=usage), reply("3", usage=usage)]
        )
    )
    agent.tools.register(add)
    instrument(agent, tracer_provider=provider, metrics=False)
    await agent.run("add")
    finished = spans.get_finished_spans()
    assert {span.instrumentation_scope.schema_url for span in finished} == {n.SEMCONV_SCHEMA_URL}
    ignored = {n.RUN_ID, n.CONVERSATION_ID}  # a fresh id each run
    return sorted(
        (
            (span.name, {k: v for k, v in (span.attributes or {}).items() if k not in ignored})
            for span in finished
        ),
        key=repr,
    )


@pytest.mark.parametrize(
    "opt_in", [None, "gen_ai_latest_experimental", "http,gen_ai_latest_experimental"]
)
async def test_the_latest_experimental_conventions_are_emitted_with_or_without_the_opt_in(
    opt_in: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # agent_flow never emitted an older version: the opt-in has nothing to switch from, and
    # the spans are the same either way, with the 1.37+ names (gen_ai.provider.name, not
    # gen_ai.system).
    monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
    baseline = await _span_attributes()
    if opt_in is not None:
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    spans = await _span_attributes()
    assert [name for name, _ in spans] == [name for name, _ in baseline]
    assert [set(attributes) for _, attributes in spans] == [set(a) for _, a in baseline]
    for name, attributes in spans:
        assert "gen_ai.system" not in attributes
        if not name.startswith("execute_tool"):
            assert attributes[n.PROVIDER_NAME] == "_OTHER"
