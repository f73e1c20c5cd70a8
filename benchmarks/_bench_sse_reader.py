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
    """The SSE clients' process: open streams and run waves on demand.

    Its first input line is a list of waves, each a list of session ids; it answers ``open``.
    Then ``open I`` opens wave I's streams (answered ``opened``: a stream left idle long is
    closed by the server), ``go I`` sends wave I's messages at once and reads its streams to
    their ``run_finished`` (answered with their latencies and whether all were complete),
    until ``end`` (answered with the slowest kinds of event over all waves).
    """
    waves: list[list[str]] = json.loads(sys.stdin.readline())
    overall = Reader()
    size = max(len(wave) for wave in waves)
    async with client_for(base, size) as client:
        opened: dict[int, tuple[contextlib.AsyncExitStack, list[Any]]] = {}
        print("open", flush=True)
        while (line := (await asyncio.to_thread(sys.stdin.readline)).split()) != ["end"]:
            command, index = line[0], int(line[1])
            wave = waves[index]
            if command == "open":
                streams = contextlib.AsyncExitStack()
                responses = await asyncio.gather(
                    *(
                        streams.enter_async_context(client.stream("GET", f"/sessions/{sid}/events"))
                        for sid in wave
                    )
                )
                opened[index] = (streams, responses)
                print("opened", flush=True)
                continue
            reader = Reader()
            streams, responses = opened.pop(index)
            # Reading from before the first message: the clients' own wait is not the server's.
            reads = [asyncio.create_task(reader.read(response)) for response in responses]
            await asyncio.gather(
                *(
                    client.post(f"/sessions/{sid}/messages", json={"message": "Add."})
                    for sid in wave
                )
            )
            await asyncio.gather(*reads)
            await streams.aclose()
            for kind, values in reader.by_kind.items():
                overall.by_kind.setdefault(kind, []).extend(values)
            answer = {"latencies": reader.latencies, "complete": reader.complete}
            print(json.dumps(answer), flush=True)
    p99s = {kind: sorted(v)[int(len(v) * 0.99)] for kind, v in overall.by_kind.items()}
    slowest = sorted(p99s, key=p99s.__getitem__, reverse=True)[:3]
    summary = ", ".join(f"{kind} {p99s[kind]:.0f}" for kind in slowest)
    print(json.dumps({"slowest_kinds": summary}), flush=True)
