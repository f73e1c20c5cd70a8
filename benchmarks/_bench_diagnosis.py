"""bench_server.py's ``--diagnose``: the server loop's lag, and each event's way to its write."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class Diagnosis:
    """The server loop's lag, and at each publish the ready queue's length and how long ago
    the event was created (``--diagnose``)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.ready: list[int] = []
        self.unpublished: list[float] = []
        self.unpublished_by_kind: dict[str, list[float]] = {}
        self.written: list[float] = []
        self.batched: list[float] = []

    def install(self) -> None:
        from agent_flow.events import EventBus

        loop = asyncio.get_running_loop()
        publish = EventBus.publish

        async def counted(bus: Any, event: Any) -> None:
            self.ready.append(len(loop._ready))  # type: ignore[attr-defined]
            delay = (time.time() - event.timestamp.timestamp()) * 1000
            self.unpublished.append(delay)
            self.unpublished_by_kind.setdefault(event.kind, []).append(delay)
            await publish(bus, event)

        EventBus.publish = counted  # type: ignore[method-assign]
        self._watch_writes()
        period = 0.005

        def tick(due: float) -> None:
            now = loop.time()
            self.lags.append((now - due) * 1000)
            loop.call_at(now + period, tick, now + period)

        loop.call_at(loop.time() + period, tick, loop.time() + period)

    def _watch_writes(self) -> None:
        """Each event's age when its frame is made (just before it is written), by way."""
        from agent_flow.server import _sse

        if not hasattr(_sse, "_frame"):
            return  # a server without these seams (an older tree, measured side by side)
        frame, chunk = _sse._frame, _sse._chunk

        def timed_frame(event_id: Any, event: Any) -> bytes:
            self.written.append((time.time() - event.timestamp.timestamp()) * 1000)
            return frame(event_id, event)

        def timed_chunk(batch: Any) -> bytes:
            now = time.time()
            self.batched.extend((now - event.timestamp.timestamp()) * 1000 for _, event in batch)
            return chunk(batch)

        _sse._frame = timed_frame
        _sse._chunk = timed_chunk

    def report(self) -> dict[str, Any]:
        def pct(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0

        busy = [lag for lag in self.lags if lag > 0.5]
        late = {kind: pct(values, 0.99) for kind, values in self.unpublished_by_kind.items()}
        slowest = sorted(late, key=late.__getitem__, reverse=True)[:2]
        ready = [float(count) for count in self.ready]
        return {
            "lag_p50_ms": pct(busy, 0.5),
            "lag_p99_ms": pct(busy, 0.99),
            "lag_max_ms": max(self.lags, default=0.0),
            "ready_at_publish_p50": pct(ready, 0.5),
            "ready_at_publish_p99": pct(ready, 0.99),
            "created_to_publish_p50_ms": pct(self.unpublished, 0.5),
            "created_to_publish_p99_ms": pct(self.unpublished, 0.99),
            "created_to_write_p50_ms": pct(self.written, 0.5),
            "created_to_write_p99_ms": pct(self.written, 0.99),
            "batched_share": len(self.batched) / max(1, len(self.written)),
            "batched_p99_ms": pct(self.batched, 0.99),
            "created_to_publish_slowest": ", ".join(f"{kind} {late[kind]:.0f}" for kind in slowest),
        }
