"""`agent-flow run --otel` exports the run over OTLP/HTTP, and the terminal shows its cost."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agent_flow.cli.render import format_cost
from agent_flow.llm.base import Usage
from agent_flow.pricing import price_usage
from tests.openai_server import OpenAIServer, sse_reply, text_chunks, tool_call_chunks


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """A stand-in OTLP/HTTP collector on 127.0.0.1 recording what it is sent."""
    received: list[tuple[str, bytes]] = []
    handler = type("Handler", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()
    thread.join()


async def test_run_with_otel_exports_the_genai_span_tree_and_metrics(
    openai_server: OpenAIServer,
    collector: tuple[str, list[tuple[str, bytes]]],
    tmp_path: Path,
) -> None:
    endpoint, received = collector
    openai_server.script(
        sse_reply(tool_call_chunks([("c1", "read_file", '{"path": "notes.txt"}')])),
        sse_reply(text_chunks("It says hello.", usage=(1000, 100))),
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_"))},
        "OPENAI_API_KEY": "sk-cli-secret",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "otel-test",
        "AGENT_FLOW_HOME": str(tmp_path / "home"),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_flow.cli",
        "run",
        "what do the notes say?",
        "--model",
        "gpt-4o-mini",
        "--base-url",
        openai_server.base_url,
        "--workspace",
        str(workspace),
        "--db",
        str(tmp_path / "s.db"),
        "--trace",
        "--otel",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    # The renderer shows each call's cost and the run's beside its tokens. The scripted
    # server names another model in its answers: the price is the requested model's.
    first = price_usage("gpt-4o-mini", Usage(prompt_tokens=20, completion_tokens=9))
    second = price_usage("gpt-4o-mini", Usage(prompt_tokens=1000, completion_tokens=100))
    assert first is not None
    assert second is not None
    shown = out.decode()
    assert f"completion tokens ({format_cost(first)})" in shown
    assert f"completion tokens ({format_cost(second)})" in shown
    assert f"completion tokens · {format_cost(first + second)} · " in shown
    paths = [path for path, _ in received]
    assert "/v1/traces" in paths
    assert "/v1/metrics" in paths
    spans = []
    for path, body in received:
        if path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}
                assert service["service.name"] == "otel-test"
                for scope in resource.scope_spans:
                    spans += list(scope.spans)
    by_id = {span.span_id: span for span in spans}
    names = sorted(span.name for span in spans)
    assert names == ["chat gpt-4o-mini", "chat gpt-4o-mini", "execute_tool read_file",
                     "invoke_agent agent"]  # fmt: skip
    (root,) = [span for span in spans if not span.parent_span_id]
    assert all(by_id[s.parent_span_id] is root for s in spans if s is not root)
    assert b"sk-cli-secret" not in b"".join(body for _, body in received)


def test_costs_are_shown_as_dollars_or_unknown_never_as_zero_for_unknown() -> None:
    assert format_cost(None) == "cost unknown"
    assert format_cost(0.00021) == "$0.00021"
    assert format_cost(1.5) == "$1.50"
    assert format_cost(0.0) == "$0.00"
