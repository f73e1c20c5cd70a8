"""A real uvicorn on a loopback port for the server tests, and a small SSE reader.

`serving(app)` binds 127.0.0.1:0 and listens *before* uvicorn starts, so a client may connect
at once (the kernel queues it until uvicorn accepts): nothing waits for the server to start.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import uvicorn


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server in another process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(config: str, db: str, port: int) -> list[str]:
    """The command line of an `agent-flow serve` process without tokens, as a test starts it."""
    return [
        sys.executable,
        "-m",
        "agent_flow.cli",
        "serve",
        "--config",
        config,
        "--db",
        db,
        "--port",
        str(port),
        "--no-token",
    ]


@asynccontextmanager
async def serving(
    app: Any, *, send_buffer: int | None = None, http: Any = "auto"
) -> AsyncIterator[httpx2.AsyncClient]:
    """Run `app` on a real uvicorn on 127.0.0.1; yield a client pointed at it.

    `http` is uvicorn's HTTP protocol (a name, or a class). `send_buffer` bounds the kernel's
    send buffer of every accepted connection (they inherit it from the listening socket), so
    a client that stops reading stalls writes soon.
    """
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only where the socket's proto says TCP.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5, http=http
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with httpx2.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=httpx2.Timeout(30.0)
        ) as client:
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()


class BodyWrites:
    """`app`, counting the response body writes (ASGI ``http.response.body`` messages with a
    body: one ``send`` each) of requests whose path ends with `path`."""

    def __init__(self, app: Any, path: str) -> None:
        self.app = app
        self.path = path
        self.count = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not scope.get("path", "").endswith(self.path):
            await self.app(scope, receive, send)
            return

        async def counted(message: dict[str, Any]) -> None:
            if message.get("body"):
                self.count += 1
            await send(message)

        await self.app(scope, receive, counted)


@dataclass
class Frame:
    """One SSE event as received."""

    event: str | None
    id: str | None
    data: str

    @property
    def json(self) -> Any:
        return json.loads(self.data)


async def frames(
    response: httpx2.Response, *, comments: list[str] | None = None
) -> AsyncIterator[Frame]:
    """Parse the SSE stream of `response` (comments are appended to `comments`)."""
    event: str | None = None
    event_id: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield Frame(event, event_id, "\n".join(data))
            event, event_id, data = None, None, []
        elif line.startswith(":"):
            if comments is not None:
                comments.append(line)
                yield Frame("comment", None, line)
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "id":
                event_id = value
            elif name == "data":
                data.append(value)


class EventStream:
    """One SSE response read frame by frame."""

    def __init__(self, response: httpx2.Response, *, comments: list[str] | None = None) -> None:
        self.response = response
        self.comments = comments
        self._frames = frames(response, comments=comments)

    async def next(self) -> Frame:
        return await anext(self._frames)

    async def until(self, kind: str) -> list[Frame]:
        """Read frames until one of `kind` arrives (inclusive)."""
        got: list[Frame] = []
        async for frame in self._frames:
            got.append(frame)
            if frame.event == kind:
                return got
        raise AssertionError(f"the stream ended before a {kind} event: {[f.event for f in got]}")

    async def rest(self) -> list[Frame]:
        """Every frame until the stream ends."""
        return [frame async for frame in self._frames]


@asynccontextmanager
async def stream(
    client: httpx2.AsyncClient, path: str, *, headers: dict[str, str] | None = None, **params: Any
) -> AsyncIterator[EventStream]:
    """Open the SSE stream at `path`."""
    async with client.stream("GET", path, headers=headers, params=params) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield EventStream(response)


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited: only its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def marked(name: str, marker: str) -> list[int]:
    """The running processes whose environment holds ``name=marker``."""
    needle = f"{name}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and running(int(entry.name)):
            found.append(int(entry.name))
    return found
