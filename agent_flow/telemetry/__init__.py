"""OpenTelemetry traces and metrics for agent_flow runs (an outer ring; optional).

``instrument(agent)`` records the agent's runs as GenAI spans and metrics (OpenTelemetry
semantic conventions 1.44.0, see `SEMCONV_VERSION`) with agent_flow's budget story attached::

    from agent_flow.telemetry import instrument
    instrument(agent)                  # the global tracer and meter providers
    await agent.run("...")

The core never imports this package: it plugs in as an `agent_flow.events.EventBus` hook and,
for what only a model call holds (its request, its first chunk, its failed attempts, its
answer), as a model-call observer (`agent_flow.llm.observers`). Each span is current while
its operation runs, so spans of instrumented libraries (the MCP SDK's, an HTTP client's)
nest under it. A run's ``gen_ai.conversation.id`` is its agent's session (``agent_flow.run.id``
names the run). It needs ``opentelemetry-api`` (``pip install 'agent-flow[otel]'`` brings it
with the SDK and an OTLP exporter) and imports it only when called. With the API and no SDK
configured the tracer is OpenTelemetry's no-op one, and a run pays for no span work.
`configure_otlp` sets up the SDK to export to an OTLP endpoint from the standard ``OTEL_*``
variables (what ``agent-flow --otel`` does).

Contents (the task, prompts, answers, tool definitions, arguments and results, and error,
warning, plan and approval texts, which may repeat them) are recorded only when
``capture_content`` is true, or, when it is not given, when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``: without, no attribute,
status or event holds any. API keys never are.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from agent_flow.errors import UserError
from agent_flow.telemetry._names import SEMCONV_SCHEMA_URL, SEMCONV_VERSION

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from agent_flow.agent import AgentExecutor
    from agent_flow.telemetry._spans import _EventTracer

__all__ = [
    "CAPTURE_CONTENT_ENV",
    "SEMCONV_VERSION",
    "Instrumentation",
    "OTLPExport",
    "configure_otlp",
    "instrument",
]

#: The variable the GenAI instrumentations read to record message contents.
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_SCOPE = "agent_flow"
_KINDS = (
    "run_started",
    "iteration_started",
    "context_built",
    "model_responded",
    "tool_call_started",
    "tool_call_completed",
    "tool_call_failed",
    "approval_required",
    "approval_resolved",
    "environment_updated",
    "history_pruned",
    "plan_updated",
    "warning_raised",
    "execution_error",
    "mcp_list_changed",
    "run_finished",
)


def _require_api() -> None:
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError as err:
        raise UserError(
            "agent_flow.telemetry needs opentelemetry-api, which is not installed; "
            "install it with: pip install 'agent-flow[otel]'"
        ) from err


class Instrumentation:
    """An agent's instrumentation; `uninstrument` stops it recording."""

    def __init__(self, tracer: _EventTracer) -> None:
        self._tracer = tracer

    def uninstrument(self) -> None:
        """Stop recording this agent's runs from its next one (a run in flight is finished)."""
        self._tracer.enabled = False


def instrument(
    agent: AgentExecutor,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    capture_content: bool | None = None,
    metrics: bool = True,
    agent_id: str | None = None,
) -> Instrumentation:
    """Record `agent`'s runs as OpenTelemetry GenAI spans and metrics.

    Args:
        agent: The agent; its event bus gets a hook, and each run a model-call observer
            (`agent_flow.llm.observers`), nothing else changes.
        tracer_provider: Where spans go (default: the global provider).
        meter_provider: Where metrics go (default: the global provider).
        capture_content: Record message contents (default: the
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` variable, else no).
        metrics: Record metrics as well as spans.
        agent_id: The agent's ``gen_ai.agent.id``, if your deployment gives agents ids
            (agent_flow has none of its own: the name is ``gen_ai.agent.name``).

    Raises:
        UserError: opentelemetry-api is not installed.
    """
    _require_api()
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace

    from agent_flow.telemetry._metrics import _Metrics
    from agent_flow.telemetry._spans import _EventTracer

    if capture_content is None:
        capture_content = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    version = _version()
    tracer = trace.get_tracer(
        _SCOPE, version, tracer_provider=tracer_provider, schema_url=SEMCONV_SCHEMA_URL
    )
    meter = (
        otel_metrics.get_meter(
            _SCOPE, version, meter_provider=meter_provider, schema_url=SEMCONV_SCHEMA_URL
        )
        if metrics
        else None
    )
    hook = _EventTracer(
        tracer,
        _Metrics(meter) if meter is not None else None,
        capture_content=capture_content,
        agent=agent,
        agent_id=agent_id,
    )
    # Only the kinds it reads: the stream's deltas cost it nothing.
    agent.events.on(_KINDS, hook)
    return Instrumentation(hook)


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent-flow")
    except PackageNotFoundError:
        return "0"


class OTLPExport:
    """The SDK providers `configure_otlp` installed; `shutdown` flushes and stops them."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider

    def shutdown(self) -> None:
        """Export what is buffered and stop (call it before the process exits)."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def configure_otlp(service_name: str = "agent-flow", *, set_global: bool = True) -> OTLPExport:
    """Install SDK tracer and meter providers that export over OTLP/HTTP, as global defaults.

    The exporters read the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ...);
    without an endpoint they send to ``http://localhost:4318``.

    Args:
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` sets one.
        set_global: Make them the global providers; without, pass them to `instrument`
            (``tracer_provider=export.tracer_provider``, likewise the meter provider).

    Raises:
        UserError: The SDK or the OTLP exporter is not installed.
    """
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as err:
        raise UserError(
            f"exporting telemetry needs the OpenTelemetry SDK and OTLP exporter ({err.name} "
            "is missing); install them with: pip install 'agent-flow[otel]'"
        ) from err
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    resource = Resource.create(attributes)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
    )
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    return OTLPExport(tracer_provider, meter_provider)
