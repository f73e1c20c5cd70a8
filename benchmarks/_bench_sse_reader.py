"""bench_server.py's SSE clients: a process that reads every session's stream to its end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from datetime import datetime
from typing import Any


def _latency_ms(timestamp: str, received: float) -> float:
    created = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    return (received - created) * 1000


def _frames(buffer: bytes) -> tuple[list[bytes], bytes]:
    *frames, rest = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
    return frames, rest


class Reader:
    """SSE clients: one stream per session, each read to its ``run_finished``."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.by_kind: dict[str, list[float]] = {}
        self.complete = True

    async def read(self, response: Any) -> None:
        ids: list[int] = []
        finished = False
        rest = b""
        async for chunk in response.aiter_raw():
            received = time.time()
            frames, rest = _frames(rest + chunk)
            for frame in frames:
                for line in frame.split(b"\n"):
                    if line.startswith(b"data: "):
                        event = json.loads(line[6:])
                        latency = _latency_ms(event["timestamp"], received)
                        self.latencies.append(latency)
                        self.by_kind.setdefault(event["kind"], []).append(latency)
                        finished = finished or event["kind"] == "run_finished"
                    elif line.startswith(b"id: "):
                        ids.append(int(line[4:]))
            if finished:
                break
        # One run per stream: its ids are its first id (fence * 2**32) plus 0..n-1.
        first = ids[0] if ids else 0
        in_order = ids == list(range(first, first + len(ids))) and first % (1 << 32) == 0
        self.complete = self.complete and finished and in_order


def client_for(base: str, n: int) -> Any:
    import httpx2

    limits = httpx2.Limits(max_connections=n + 20, max_keepalive_connections=n + 20)
    return httpx2.AsyncClient(base_url=base, timeout=None, limits=limits)


async def read_streams(base: str) -> None:
    """The SSE clients' process: open every session's stream, say so, then on "go" run the waves.

    Its input is a list of waves, each a list of session ids. A wave's messages are sent at
    once and its streams read to their ``run_finished``; then the next wave's.
    """
    waves: list[list[str]] = json.loads(sys.stdin.readline())
    sessions = [sid for wave in waves for sid in wave]
    reader = Reader()
    async with client_for(base, len(sessions)) as client, contextlib.AsyncExitStack() as streams:
        responses = await asyncio.gather(
            *(
                streams.enter_async_context(client.stream("GET", f"/sessions/{sid}/events"))
                for sid in sessions
            )
        )
        print("open", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        streams_of = dict(zip(sessions, responses, strict=True))
        for wave in waves:
            # Reading from before the first message: the clients' own wait is not the server's.
            reads = [asyncio.create_task(reader.read(streams_of[sid])) for sid in wave]
            await asyncio.gather(
                *(
                    client.post(f"/sessions/{sid}/messages", json={"message": "Add."})
                    for sid in wave
                )
            )
            await asyncio.gather(*reads)
    p99s = {kind: sorted(v)[int(len(v) * 0.99)] for kind, v in reader.by_kind.items()}
    slowest = sorted(p99s, key=p99s.__getitem__, reverse=True)[:3]
    print(
        json.dumps(
            {
                "latencies": reader.latencies,
                "complete": reader.complete,
                "slowest_kinds": ", ".join(f"{kind} {p99s[kind]:.0f}" for kind in slowest),
            }
        ),
        flush=True,
    )
