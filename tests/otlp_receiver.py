"""A real OTLP/HTTP receiver on 127.0.0.1 that decodes what it is sent with opentelemetry-proto.

The telemetry tests export through the real SDK and OTLP/HTTP exporter (the very path
``agent-flow --otel`` takes) to this receiver, in this process or from a CLI, server or
worker process, and read back what a collector would see::

    with OTLPReceiver() as receiver:              # a thread serving 127.0.0.1:<port>
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        ...                                       # the exporting process runs and flushes
        receiver.wait_for(lambda r: len(r.spans()) >= 4)
        spans = receiver.spans()                  # decoded, with attributes as Python values

Every request body is kept (``raw``: a content-capture test searches the bytes), gzip bodies
are decompressed, and each export wakes `wait_for` (nothing sleeps to synchronize). Run as
``python -m tests.otlp_receiver`` it serves in its own process (a benchmark's exporter then
pays for sending, not for decoding; nothing is kept) and prints its endpoint on the first
line, serving until its standard input closes.
"""

from __future__ import annotations

import gzip
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["OTLPReceiver", "Point", "Span", "SpanEvent", "value_of"]

_DECODERS: dict[str, Any] = {
    "/v1/traces": ExportTraceServiceRequest,
    "/v1/metrics": ExportMetricsServiceRequest,
    "/v1/logs": ExportLogsServiceRequest,
}


def value_of(value: AnyValue) -> Any:
    """An OTLP attribute value as the Python value it was set from (arrays as tuples)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(value_of(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in pairs}


@dataclass(frozen=True)
class SpanEvent:
    """A span event as received."""

    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True)
class Span:
    """A span as received (ids as hex strings; ``parent_id`` empty for a root)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...]
    status_code: int
    status_message: str
    scope: str
    resource: dict[str, Any]


@dataclass(frozen=True)
class Point:
    """A metric data point as received (histograms: count, sum and bucket layout)."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    value: float | None = None
    count: int | None = None
    total: float | None = None
    bounds: tuple[float, ...] = ()


@dataclass
class _Store:
    keep: bool = True
    received: int = 0
    raw: list[tuple[str, bytes]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)


class _Handler(BaseHTTPRequestHandler):
    store: _Store

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        known = self.path in _DECODERS
        if known:
            with self.store.changed:
                self.store.received += 1
                if self.store.keep:
                    self.store.raw.append((self.path, body))
                self.store.changed.notify_all()
        self.send_response(200 if known else 404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class OTLPReceiver:
    """An OTLP/HTTP receiver serving on a thread of this process; see the module docstring."""

    def __init__(self, *, keep: bool = True) -> None:
        self._store = _Store(keep=keep)
        handler = type("Handler", (_Handler,), {"store": self._store})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL to give ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def raw(self) -> list[tuple[str, bytes]]:
        """Every request body received so far, with its path."""
        with self._store.changed:
            return list(self._store.raw)

    def clear(self) -> None:
        """Forget everything received so far."""
        with self._store.changed:
            self._store.raw.clear()

    def wait_for(self, ready: Callable[[OTLPReceiver], bool], timeout: float = 30.0) -> None:
        """Block until `ready(self)` holds, re-checking after each export; fail after `timeout`."""
        with self._store.changed:
            if not self._store.changed.wait_for(lambda: ready(self), timeout):
                raise AssertionError(f"the receiver did not get what was awaited in {timeout} s")

    def _requests(self, path: str) -> Iterator[Any]:
        decoder = _DECODERS[path]
        for got, body in self._store.raw:
            if got == path:
                yield decoder.FromString(body)

    def spans(self) -> list[Span]:
        """Every span received, in the order received."""
        found: list[Span] = []
        for request in self._requests("/v1/traces"):
            for resource in request.resource_spans:
                owner = _attributes(resource.resource.attributes)
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        found.append(
                            Span(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_id=span.parent_span_id.hex(),
                                kind=span.kind,
                                start_ns=span.start_time_unix_nano,
                                end_ns=span.end_time_unix_nano,
                                attributes=_attributes(span.attributes),
                                events=tuple(
                                    SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes))
                                    for e in span.events
                                ),
                                status_code=span.status.code,
                                status_message=span.status.message,
                                scope=scope.scope.name,
                                resource=owner,
                            )
                        )
        return found

    def points(self, metric: str | None = None) -> list[Point]:
        """The data points of the last metrics export (of `metric`, or all): cumulative."""
        found: list[Point] = []
        for request in list(self._requests("/v1/metrics"))[-1:]:
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for item in scope.metrics:
                        if metric is not None and item.name != metric:
                            continue
                        found.extend(_points_of(item))
        return found

    def log_records(self) -> list[Any]:
        """Every log record received (OTLP logs), as decoded messages."""
        return [
            record
            for request in self._requests("/v1/logs")
            for resource in request.resource_logs
            for scope in resource.scope_logs
            for record in scope.log_records
        ]


def _points_of(metric: Any) -> Iterator[Point]:
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind)
    for point in data.data_points:
        attributes = _attributes(point.attributes)
        if kind in ("histogram", "exponential_histogram"):
            yield Point(
                metric.name,
                metric.unit,
                attributes,
                count=point.count,
                total=point.sum,
                bounds=tuple(getattr(point, "explicit_bounds", ())),
            )
        else:
            number = point.as_double if point.HasField("as_double") else point.as_int
            yield Point(metric.name, metric.unit, attributes, value=float(number))


if __name__ == "__main__":
    with OTLPReceiver(keep=False) as receiver:  # a benchmark's sink: decode nothing
        print(receiver.endpoint, flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin
