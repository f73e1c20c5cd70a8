"""The HTTP service: agent sessions over JSON, live event streams over SSE, approvals.

`create_app` builds the FastAPI application (``agent-flow serve`` runs it with uvicorn; it
mounts in any ASGI app too); `ServerSettings` says how it listens and what clients may do;
`with_json_400` makes uvicorn answer bytes that are no HTTP request with the API's error
body, as ``serve`` does (``uvicorn.run(app, http=with_json_400(AutoHTTPProtocol))``).
It needs the ``server`` extra (``pip install 'agent-flow[server]'``): nothing else in
agent_flow imports this package.

Modules: `app` (the routes), `models` (request and response bodies), `settings`; privately
`_manager` (the sessions the server runs), `_live` (one session: its bus, run, numbering of
events and approvals) and `_middleware` (bearer token, body limit).
"""

from __future__ import annotations

from agent_flow.server._http400 import with_json_400
from agent_flow.server.app import create_app
from agent_flow.server.settings import ServerSettings, is_loopback_host

__all__ = ["ServerSettings", "create_app", "is_loopback_host", "with_json_400"]
