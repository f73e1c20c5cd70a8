"""Carrying a trace across processes: from an HTTP request to a run queued on another worker.

A run's ``invoke_agent`` span is a child of whatever trace context is current when the run
starts. Where a run starts elsewhere than where it was asked for (a task that outlives the
request, a queued run on another process), capture the context where it is asked for and make
it current where it runs::

    carrier = inject_context()          # when enqueuing: {"traceparent": ..., ...}
    ...                                 # stored with the job (plain strings: JSON is fine)
    with attached_context(carrier):     # in the worker, around the run
        await agent.run(task)

The carrier is W3C Trace Context (``traceparent``, ``tracestate``), through the globally
configured propagator (W3C Trace Context and Baggage unless ``OTEL_PROPAGATORS`` says
otherwise). Both functions work whether or not OpenTelemetry is installed: without it a
carrier is empty and attaching one does nothing, so callers need no guard of their own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["TRACE_HEADERS", "attached_context", "inject_context"]

#: The W3C Trace Context headers a carrier holds (and an HTTP request may bring).
TRACE_HEADERS = ("traceparent", "tracestate")


def inject_context() -> dict[str, str]:
    """The current trace context as a carrier of strings (empty: none, or no OpenTelemetry)."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def attached_context(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context in `carrier` current for the block (and tasks it starts).

    Does nothing when `carrier` is ``None`` or empty, or OpenTelemetry is not installed. A
    carrier without a valid ``traceparent`` leaves the block in a context with no parent
    span, as a fresh trace.

    Args:
        carrier: What `inject_context` returned (or an HTTP request's headers).
    """
    if not carrier:
        yield
        return
    try:
        from opentelemetry import context, propagate
    except ImportError:
        yield
        return
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
