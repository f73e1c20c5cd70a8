"""ASGI middleware of the service: the bearer token and the request body limit."""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BearerTokenMiddleware", "BodyLimitMiddleware", "send_error"]


async def send_error(send: Send, status: int, code: str, message: str) -> None:
    """Answer with `status` and an `ErrorBody` (for middleware, before any route runs)."""
    body = json.dumps({"code": code, "message": message, "field": None, "run_id": None}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_PUBLIC = frozenset({"/", "/static/inspector.js", "/static/inspector.css"})


class BearerTokenMiddleware:
    """Refuse every HTTP request without ``Authorization: Bearer <token>`` (401)."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] in _PUBLIC:
            # The inspector's static files hold no data; the page asks for the token.
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self._expected):
            await send_error(
                send,
                401,
                "unauthorized",
                "this server requires 'Authorization: Bearer <token>' with its token",
            )
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse request bodies over `limit` bytes (413), declared or streamed."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = (
            f"the request body is larger than this server's limit of {self.limit} bytes; send less"
        )
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await send_error(send, 400, "bad_request", "the Content-Length is not a number")
                return
            if size > self.limit:
                await send_error(send, 413, "body_too_large", too_big)
                return
        chunks: list[Message] = []
        received = 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            received += len(message.get("body", b""))
            if received > self.limit:
                await send_error(send, 413, "body_too_large", too_big)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if chunks:
                return chunks.pop(0)
            return await receive()

        await self.app(scope, replay, send)
