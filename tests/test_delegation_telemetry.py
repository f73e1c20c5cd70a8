"""A delegated child in the parent's trace: its ``invoke_agent`` span nests under the call's.

The child's events reach the parent's bus (and so the telemetry hook) in the child's task,
inside the parent's ``execute_tool`` span: the child's run and its model calls become spans
of the parent's trace, one level down, with no telemetry code of its own.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Delegate
from agent_flow.telemetry import instrument
from agent_flow.testing import ScriptedLLM, call, reply


def parent_of(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> str | None:
    if span.parent is None or span.parent.span_id not in spans:
        return None
    return spans[span.parent.span_id].name


async def test_the_childs_invoke_agent_span_is_a_child_of_the_parents_execute_tool_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    delegate = Delegate(
        "investigate", "I.", llm=ScriptedLLM(["child answer"]), config=AgentConfig(name="child")
    )
    agent = AgentExecutor(
        ScriptedLLM([reply(tool_calls=[call("investigate", task="t")]), "done"]),
        config=AgentConfig(name="parent", context=ContextConfig(max_tokens=8000, counter="approx")),
    )
    delegate.add_to(agent)
    instrument(agent, tracer_provider=provider, metrics=False)
    outcome = await agent.run("go")
    assert outcome.final_text == "done"
    finished = exporter.get_finished_spans()
    spans = {s.context.span_id: s for s in finished if s.context is not None}
    tree = sorted((s.name, parent_of(s, spans)) for s in finished)
    assert tree == [
        ("chat scripted", "invoke_agent child"),
        ("chat scripted", "invoke_agent parent"),
        ("chat scripted", "invoke_agent parent"),
        ("execute_tool investigate", "invoke_agent parent"),
        ("invoke_agent child", "execute_tool investigate"),
        ("invoke_agent parent", None),
    ]
    assert len({s.context.trace_id for s in finished if s.context is not None}) == 1
