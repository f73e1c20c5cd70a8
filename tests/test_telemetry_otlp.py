"""The GenAI telemetry as a collector receives it: the SDK exporting OTLP/HTTP to a receiver.

Every test here goes the way ``agent-flow --otel`` goes: `configure_otlp` (batch span
processor, periodic metric reader, OTLP/HTTP exporters) sending to a real receiver on
loopback (`tests.otlp_receiver`) that decodes the protobuf with opentelemetry-proto, with the
real `OpenAIClient` talking to the scripted server over real HTTP. The CLI, the server and
the worker are in `test_telemetry_cli.py` and `test_telemetry_processes.py`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.llm import OpenAIClient
from agent_flow.sessions import InMemorySessionStore
from agent_flow.telemetry import OTLPExport, configure_otlp, instrument
from agent_flow.telemetry import _names as n
from agent_flow.tools import tool
from tests.openai_server import (
    OpenAIServer,
    Reply,
    completion_body,
    error_reply,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)
from tests.otlp_receiver import OTLPReceiver, Span

CONTEXT = ContextConfig(counter="approx")


@tool
def lookup(key: str) -> str:
    """Look a key up in the notes.

    Args:
        key: The key.
    """
    return f"the value of {key}"


@tool
def explode(reason: str) -> str:
    """Fail on purpose.

    Args:
        reason: Why.
    """
    raise RuntimeError(f"boom: {reason}")


@asynccontextmanager
async def exporting(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[OTLPReceiver, OTLPExport]]:
    """A receiver, and SDK providers exporting to it as ``agent-flow --otel`` configures them."""
    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        export = configure_otlp("otlp-test", set_global=False)
        try:
            yield receiver, export
        finally:
            export.shutdown()


class LogRecords(logging.Handler):
    """Every line the OpenTelemetry SDK, its exporter and the telemetry ring log, at DEBUG."""

    NAMES = ("opentelemetry", "agent_flow.telemetry", "urllib3", "requests")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []
        self._levels = {}
        for name in self.NAMES:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(logging.DEBUG)
            logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))

    def close(self) -> None:
        for name, level in self._levels.items():
            logger = logging.getLogger(name)
            logger.removeHandler(self)
            logger.setLevel(level)
        super().close()


def flush(export: OTLPExport) -> None:
    """Export everything buffered now (the receiver has it when this returns)."""
    export.tracer_provider.force_flush()
    export.meter_provider.force_flush()


def agent_on(
    server: OpenAIServer,
    export: OTLPExport,
    *,
    capture: bool = False,
    agent_id: str | None = None,
    **options: Any,
) -> tuple[AgentExecutor, OpenAIClient]:
    client = OpenAIClient("gpt-4o-mini", base_url=server.base_url, api_key="k")
    client.retry_base_delay = 0.001
    agent = AgentExecutor(
        client, config=AgentConfig(context=CONTEXT), store=InMemorySessionStore(), **options
    )
    agent.tools.register(lookup)
    agent.tools.register(explode)
    instrument(
        agent,
        tracer_provider=export.tracer_provider,
        meter_provider=export.meter_provider,
        capture_content=capture,
        agent_id=agent_id,
    )
    return agent, client


def with_id(chunks: list[dict[str, Any]], response_id: str) -> list[dict[str, Any]]:
    return [{**chunk, "id": response_id} for chunk in chunks]


def named(spans: list[Span], prefix: str) -> list[Span]:
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_ns)


def assert_tree_is_sound(spans: list[Span]) -> None:
    """Each run is a root; every chat and tool span is its child, in its trace and time."""
    by_id = {span.span_id: span for span in spans}
    for span in spans:
        if span.name.startswith("invoke_agent"):
            assert span.parent_id == ""
            continue
        parent = by_id[span.parent_id]
        assert parent.name.startswith("invoke_agent"), (span.name, parent.name)
        assert parent.trace_id == span.trace_id
        assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns


# -- 1 and 2: a session is a conversation; what was asked and answered ---------------------


async def test_a_sessions_runs_are_one_conversation_and_say_what_was_asked_and_answered(
    monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    openai_server.script(
        sse_reply(with_id(tool_call_chunks([("c1", "lookup", '{"key": "a"}')]), "resp-1")),
        sse_reply(with_id(text_chunks("found it"), "resp-2")),
        sse_reply(with_id(text_chunks("once more"), "resp-3")),
    )
    async with exporting(monkeypatch) as (receiver, export):
        agent, client = agent_on(openai_server, export, agent_id="deployment-agent-7")
        first = await agent.run("look a up")
        second = await agent.send("once more")
        await client.aclose()
        flush(export)
        spans = receiver.spans()

    session = agent.session_id
    assert session is not None
    runs = named(spans, "invoke_agent")
    assert [r.attributes[n.RUN_ID] for r in runs] == [first.run_id, second.run_id]
    assert {r.attributes[n.AGENT_ID] for r in runs} == {"deployment-agent-7"}
    # One conversation: the session, on every run and model call; the run id apart.
    for span in spans:
        if not span.name.startswith("execute_tool"):
            assert span.attributes[n.CONVERSATION_ID] == session
    assert_tree_is_sound(spans)
    ours = spans
    chats = named(ours, "chat")
    assert len(chats) == 3
    for chat, body, response_id in zip(
        chats, openai_server.bodies, ["resp-1", "resp-2", "resp-3"], strict=True
    ):
        assert chat.attributes[n.REQUEST_MAX_TOKENS] == body["max_tokens"]
        assert chat.attributes[n.RESPONSE_ID] == response_id
        first_chunk = chat.attributes[n.TIME_TO_FIRST_CHUNK]
        assert 0 < first_chunk <= (chat.end_ns - chat.start_ns) / 1e9
    (tool_span,) = named(ours, "execute_tool")
    assert tool_span.attributes[n.TOOL_DESCRIPTION] == "Look a key up in the notes."
    assert tool_span.attributes[n.TOOL_TYPE] == "function"


# -- 3: contents when asked for, and then only -----------------------------------------------

# The conventions' input and output message schemas, the parts agent_flow sends.
_PART = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"type": {"const": "text"}, "content": {"type": "string"}},
            "required": ["type", "content"],
        },
        {
            "type": "object",
            "properties": {"type": {"const": "reasoning"}, "content": {"type": "string"}},
            "required": ["type", "content"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "tool_call"},
                "id": {"type": ["string", "null"]},
                "name": {"type": "string"},
            },
            "required": ["type", "name"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "tool_call_response"},
                "id": {"type": ["string", "null"]},
            },
            "required": ["type", "response"],
        },
    ]
}
_ROLE = {"enum": ["system", "user", "assistant", "tool"]}
INPUT_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"role": _ROLE, "parts": {"type": "array", "items": _PART}},
        "required": ["role", "parts"],
    },
}
OUTPUT_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "role": _ROLE,
            "parts": {"type": "array", "items": _PART},
            "finish_reason": {"type": "string"},
        },
        "required": ["role", "parts", "finish_reason"],
    },
}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def semconv_input(wire: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat-completions messages a server received, as the conventions' input messages."""
    messages = []
    for message in wire:
        parts: list[dict[str, Any]] = []
        if message["role"] == "tool":
            parts.append(
                {"type": "tool_call_response", "id": message["tool_call_id"],
                 "response": message["content"]}
            )  # fmt: skip
        elif message.get("content"):
            parts.append({"type": "text", "content": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call["function"]
            parts.append(
                {"type": "tool_call", "id": call["id"], "name": function["name"],
                 "arguments": _arguments(function["arguments"])}
            )  # fmt: skip
        messages.append({"role": message["role"], "parts": parts})
    return messages


async def test_with_contents_on_chat_spans_carry_the_prompt_the_answer_and_the_tools(
    monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    openai_server.script(
        sse_reply(tool_call_chunks([("c1", "lookup", '{"key": "a"}')], text="Let me look.")),
        sse_reply(text_chunks("It is the value of a.", reasoning="it said so")),
    )
    async with exporting(monkeypatch) as (receiver, export):
        agent, client = agent_on(openai_server, export, capture=True)
        await agent.run("what is a?")
        await client.aclose()
        flush(export)
        spans = receiver.spans()

    chats = named(spans, "chat")
    assert len(chats) == 2
    for chat, body in zip(chats, openai_server.bodies, strict=True):
        sent = json.loads(chat.attributes[n.INPUT_MESSAGES])
        jsonschema.validate(sent, INPUT_SCHEMA)
        assert sent == semconv_input(body["messages"])
        assert json.loads(chat.attributes[n.TOOL_DEFINITIONS]) == [
            {"type": "function", **tool["function"]} for tool in body["tools"]
        ]
    answers = [json.loads(chat.attributes[n.OUTPUT_MESSAGES]) for chat in chats]
    for answer in answers:
        jsonschema.validate(answer, OUTPUT_SCHEMA)
    assert answers[0] == [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "Let me look."},
                {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"key": "a"}},
            ],
            "finish_reason": "tool_call",
        }
    ]
    assert answers[1] == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "it said so"},
                {"type": "text", "content": "It is the value of a."},
            ],
            "finish_reason": "stop",
        }
    ]


SECRETS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=6, max_size=12).map(
    lambda text: f"zq{text}qz"
)


@settings(max_examples=6)
@given(secret=SECRETS, where=st.sets(st.sampled_from(["task", "args", "error", "answer"])))
async def test_without_contents_nothing_a_run_was_told_or_said_leaves_the_process(
    secret: str, where: set[str]
) -> None:
    # The secret is in everything that may carry content: the task, a tool's arguments and
    # result, a tool's exception, a server error's body (a retried 500, a final 400), the
    # answer, and the failed run's final text.
    def said(part: str) -> str:
        return secret if part in where else "plain"

    arguments = json.dumps({"key": said("args")})
    monkeypatch = pytest.MonkeyPatch()
    logged = LogRecords()
    try:
        async with (
            OpenAIServer() as server,
            exporting(monkeypatch) as (receiver, export),
        ):
            server.script(
                error_reply(500, f"overloaded: {said('error')}"),
                sse_reply(
                    tool_call_chunks(
                        [
                            ("c1", "lookup", arguments),
                            ("c2", "explode", json.dumps({"reason": said("error")})),
                        ]
                    )
                ),
                sse_reply(text_chunks(f"the answer: {said('answer')}")),
                error_reply(400, f"refused: {said('error')}"),
            )
            agent, client = agent_on(server, export)
            answered = await agent.run(f"task: {said('task')}")
            failed = await agent.send(f"and: {said('task')}")
            await client.aclose()
            flush(export)
            raw = b"".join(body for _, body in receiver.raw)
            spans = receiver.spans()
    finally:
        logged.close()
        monkeypatch.undo()

    assert answered.stop_reason == "answered"
    assert failed.stop_reason == "error"
    assert secret.encode() not in raw
    assert logged.records  # the exporter's debug lines were captured, and hold none of it
    assert not any(secret in text for text in logged.records)
    # What the spans say instead: the kind of each failure, in error.type, never its words.
    (exploded,) = [s for s in spans if s.attributes.get(n.TOOL_NAME) == "explode"]
    assert exploded.attributes[n.ERROR_TYPE] == "exception"
    assert (exploded.status_code, exploded.status_message) == (2, "")
    refused = named(spans, "chat")[-1]
    assert refused.attributes[n.ERROR_TYPE] == "ModelBadRequestError"
    assert refused.status_message == ""
    runs = named(spans, "invoke_agent")
    assert runs[-1].status_message == ""
    retry = named(spans, "chat")[0].events[0]
    assert retry.attributes[n.HTTP_STATUS_CODE] == 500
    assert n.RETRY_REASON not in retry.attributes


# -- 4: each attempt of a retried call --------------------------------------------------------

_FAULT_REPLIES = {
    "500": lambda i: error_reply(500, f"overloaded {i}"),
    "429": lambda i: error_reply(429, f"slow down {i}"),
    "cut": lambda i: sse_reply(text_chunks("half", finish_reason=None, usage=None), done=False),
    "corrupt": lambda i: sse_reply([f"{{not json {i}"]),
}
_FAULT_OF = {
    "500": ("ModelServerError", 500),
    "429": ("ModelRateLimitError", 429),
    "cut": ("IncompleteStreamError", None),
    "corrupt": ("MalformedChunkError", None),
}


@settings(max_examples=12)
@given(faults=st.lists(st.sampled_from(sorted(_FAULT_REPLIES)), max_size=2))
async def test_a_retried_call_is_one_span_with_an_event_per_failed_attempt(
    faults: list[str],
) -> None:
    monkeypatch = pytest.MonkeyPatch()
    try:
        async with OpenAIServer() as server, exporting(monkeypatch) as (receiver, export):
            replies: list[Reply] = [_FAULT_REPLIES[f](i) for i, f in enumerate(faults)]
            server.script(*replies, sse_reply(text_chunks("made it")))
            agent, client = agent_on(server, export)
            outcome = await agent.run("try")
            await client.aclose()
            flush(export)
            spans = receiver.spans()
            durations = receiver.points(n.DURATION_METRIC)
    finally:
        monkeypatch.undo()

    assert outcome.final_text == "made it"
    (chat,) = named(spans, "chat")
    assert n.ERROR_TYPE not in chat.attributes
    assert chat.attributes.get(n.ATTEMPTS, 1) == len(faults) + 1
    assert [e.name for e in chat.events] == [n.RETRY] * len(faults)
    for attempt, (event, fault) in enumerate(zip(chat.events, faults, strict=True), start=1):
        error_type, status = _FAULT_OF[fault]
        assert event.attributes[n.ERROR_TYPE] == error_type
        assert event.attributes.get(n.HTTP_STATUS_CODE) == status
        assert event.attributes[n.RETRY_ATTEMPT] == attempt
        assert event.attributes[n.RETRY_MAX_ATTEMPTS] == 3
        assert event.attributes[n.RETRY_DELAY] >= 0
        assert chat.start_ns <= event.time_ns <= chat.end_ns
    # One logical call, one point: the retries are inside its duration.
    (point,) = [p for p in durations if p.attributes[n.OPERATION_NAME] == "chat"]
    assert point.count == 1 and n.ERROR_TYPE not in point.attributes


# -- 6: metrics -------------------------------------------------------------------------------

# The conventions' advised boundaries (gen-ai-metrics.md), spelled out here on purpose.
TOKEN_BOUNDS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                16777216, 67108864)  # fmt: skip
SECONDS_BOUNDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                  40.96, 81.92)  # fmt: skip


async def test_failed_calls_are_in_the_duration_and_streamed_ones_have_a_first_chunk(
    monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    openai_server.script(
        sse_reply(tool_call_chunks([("c1", "lookup", '{"key": "a"}')])),
        sse_reply(text_chunks("streamed")),
        json_reply(completion_body("whole")),
        error_reply(400, "refused"),
    )
    async with exporting(monkeypatch) as (receiver, export):
        streamed, first = agent_on(openai_server, export)
        await streamed.run("one")
        whole, second = agent_on(openai_server, export, stream=False)
        await whole.run("two")
        failed = await whole.send("three")
        await first.aclose()
        await second.aclose()
        flush(export)
        points = receiver.points()

    assert failed.stop_reason == "error"
    durations = [p for p in points if p.metric == n.DURATION_METRIC]
    chats = [p for p in durations if p.attributes[n.OPERATION_NAME] == "chat"]
    assert sum(p.count for p in chats if n.ERROR_TYPE not in p.attributes) == 3
    (refused,) = [p for p in chats if n.ERROR_TYPE in p.attributes]
    assert (refused.attributes[n.ERROR_TYPE], refused.count) == ("ModelBadRequestError", 1)
    runs = [p for p in durations if p.attributes[n.OPERATION_NAME] == "invoke_agent"]
    assert sorted((p.attributes.get(n.ERROR_TYPE, ""), p.count) for p in runs) == [
        ("", 2),
        ("ModelBadRequestError", 1),
    ]
    # Time to first chunk: the two streamed calls, none of the others.
    (first_chunks,) = [p for p in points if p.metric == n.TIME_TO_FIRST_CHUNK_METRIC]
    assert first_chunks.count == 2 and first_chunks.unit == "s"
    assert first_chunks.bounds == SECONDS_BOUNDS
    assert {p.bounds for p in durations} == {SECONDS_BOUNDS}
    tokens = [p for p in points if p.metric == n.TOKEN_USAGE_METRIC]
    assert tokens and {p.bounds for p in tokens} == {TOKEN_BOUNDS}
