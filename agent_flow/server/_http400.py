"""uvicorn's answer to bytes that are no HTTP request, as the API's JSON error.

uvicorn answers a request it cannot parse (a malformed request line or header, framing that
breaks) itself, before any app runs: 400 with the plain text "Invalid HTTP request
received.". Every other refusal of the service is an `ErrorBody`; `with_json_400(protocol)`
is uvicorn's HTTP `protocol` class answering that one as an `ErrorBody` too: 400, code
``bad_http_request``, the connection closed as before. `agent-flow serve` runs it.

uvicorn's protocols (h11, httptools, zttp) each answer through their ``send_400_response``;
a protocol without one is returned as it is.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_flow.server._errors import error_body

__all__ = ["BAD_HTTP_REQUEST", "with_json_400"]

#: The code of the answer to bytes that are no HTTP request.
BAD_HTTP_REQUEST = "bad_http_request"


class _Json400:
    """Writes uvicorn's 400 for an unparsable request as an `ErrorBody` (mixed in first)."""

    transport: asyncio.Transport
    server_state: Any

    def send_400_response(self, msg: str) -> None:
        body = error_body(
            BAD_HTTP_REQUEST,
            f"{msg.rstrip('.')}: the bytes received are not a well-formed HTTP/1.1 request "
            "(request line, headers, or body framing)",
        )
        head = [
            b"HTTP/1.1 400 Bad Request\r\n",
            # uvicorn's own (server, date), as on every other answer.
            *(name + b": " + value + b"\r\n" for name, value in _default_headers(self)),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        # The connection ends here: its parser's state (h11's, zttp's) is not consulted again.
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def _default_headers(protocol: object) -> list[tuple[bytes, bytes]]:
    headers = getattr(getattr(protocol, "server_state", None), "default_headers", None)
    return list(headers) if isinstance(headers, list) else []


def with_json_400(protocol: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """`protocol` (a uvicorn HTTP protocol class) answering unparsable requests as JSON."""
    if not callable(getattr(protocol, "send_400_response", None)):
        return protocol
    return type(f"Json400{protocol.__name__}", (_Json400, protocol), {})
