"""ASGI middleware of the service: the request body limit (the guard is `_auth`'s)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_flow.server._errors import send_error

__all__ = ["BodyLimitMiddleware"]


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
