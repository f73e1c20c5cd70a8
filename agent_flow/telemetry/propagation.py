"""W3C trace context across processes: `inject_context` and `attached_context`.

A minimal version (to be reconciled with the telemetry ring's own): OpenTelemetry's API is
imported lazily, and both functions do nothing when it is not installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["attached_context", "inject_context"]


def inject_context() -> dict[str, str]:
    """The current span's context as a W3C ``traceparent`` carrier ({} without OpenTelemetry)."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def attached_context(carrier: dict[str, str] | None) -> Iterator[None]:
    """Make the context in `carrier` current inside the block (nothing without one)."""
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
