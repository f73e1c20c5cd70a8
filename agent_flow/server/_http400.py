"""uvicorn's answer to bytes that are no HTTP request, as the API's JSON error.

uvicorn answers a request it cannot parse (a malformed request line or header, framing that
breaks, a head past its size limit) itself, before any app runs: 400 with the plain text
"Invalid HTTP request received.". Every other refusal of the service is an `ErrorBody`;
`with_json_400(protocol)` is uvicorn's HTTP `protocol` class answering that one as an
`ErrorBody` too: 400, code ``bad_http_request``, the connection closed as before. When the
bytes break in the middle of a request whose answer has already begun (the app refused it
early, and the client went on sending), nothing is written: the connection is closed, as
uvicorn's h11 protocol does then. `agent-flow serve` runs it.

The classes have fixed names in this module (``Json400`` and the base's name), so a config
holding one pickles (uvicorn's workers and reloader start processes that way), and
``Json400AutoHTTPProtocol`` names the one for the protocol uvicorn picks by default::

    uvicorn.run(app, http=with_json_400(AutoHTTPProtocol), workers=4)
    uvicorn pkg:app --http agent_flow.server._http400:Json400AutoHTTPProtocol

uvicorn's protocols (h11, httptools, zttp) each answer through their ``send_400_response``;
a protocol without one is returned as it is.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from agent_flow.server._errors import error_body

__all__ = ["BAD_HTTP_REQUEST", "with_json_400"]

#: The code of the answer to bytes that are no HTTP request.
BAD_HTTP_REQUEST = "bad_http_request"

#: uvicorn's HTTP/1.1 protocols by class name, for `__getattr__` to rebuild a class by name.
_UVICORN_PROTOCOLS = {
    "H11Protocol": "uvicorn.protocols.http.h11_impl",
    "HttpToolsProtocol": "uvicorn.protocols.http.httptools_impl",
    "ZttpProtocol": "uvicorn.protocols.http.zttp_impl",
}
_PREFIX = "Json400"
_made: dict[type[asyncio.Protocol], type[asyncio.Protocol]] = {}


class _Json400:
    """Writes uvicorn's 400 for an unparsable request as an `ErrorBody` (mixed in first)."""

    transport: asyncio.Transport
    server_state: Any
    cycle: Any

    def send_400_response(self, msg: str) -> None:
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            # An answer to this request is being written: a second one would land inside it.
            self.transport.close()
            return
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
    """`protocol` (a uvicorn HTTP protocol class) answering unparsable requests as JSON.

    The same class for the same `protocol` every time, named ``Json400`` + its name here.

    Raises:
        TypeError: `protocol` is not a class (uvicorn's protocol names, such as ``"h11"``,
            are resolved by uvicorn: give the class).
    """
    if not isinstance(protocol, type):
        raise TypeError(f"with_json_400 takes a protocol class, not {protocol!r}")
    if not callable(getattr(protocol, "send_400_response", None)):
        return protocol
    made = _made.get(protocol)
    if made is None:
        name = _PREFIX + protocol.__name__
        made = type(name, (_Json400, protocol), {"__module__": __name__, "__qualname__": name})
        _made[protocol] = made
    return made


def __getattr__(name: str) -> type[asyncio.Protocol]:
    # The classes `with_json_400` makes, by name: what unpickling a config in a new process,
    # or an import string, asks for.
    if name == _PREFIX + "AutoHTTPProtocol":
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        return with_json_400(AutoHTTPProtocol)
    base = name.removeprefix(_PREFIX)
    if base != name and base in _UVICORN_PROTOCOLS:
        module = importlib.import_module(_UVICORN_PROTOCOLS[base])
        return with_json_400(getattr(module, base))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
