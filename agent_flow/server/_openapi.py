"""What the OpenAPI document says that FastAPI cannot derive from the routes alone.

FastAPI documents each route's parameters and bodies from its pydantic models. This module
adds the rest, so that the document states what the server really does (``schemathesis run
--checks all`` holds the server to it, in ``tests/test_server_fuzz.py``):

- `Refusals`: every route's error responses, each an `ErrorBody` in ``application/json``:
  those of `agent_flow.server._auth.GuardMiddleware` before any route (400 without a
  ``Host``, 421 for a foreign one, 401 without a token where the server has tokens, 403 for
  a state-changing request from a foreign ``Origin``, 415 for a ``POST`` that is not JSON
  where it has none), 413 for a body over the limit, and the route's own.
- `EVENT_STREAM`: the content of the event stream, one SSE event at a time: ``event`` is
  the event's kind, ``data`` its JSON (an `AgentEvent`), ``id`` its id.
- `complete_document`: the `AgentEvent` models among the components, the bearer scheme where
  the server has tokens, and a new session's choices as this server offers them: its model
  endpoints and their models (``GET /endpoints``), its skills, and ``base_url`` and
  ``workspace`` only where the server allows them. (Whether a workspace exists, or a model
  belongs to the chosen endpoint, no schema can say: those stay 422s of their own.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_flow.config import AgentConfig
from agent_flow.events import EVENT_ADAPTER, EVENT_KINDS
from agent_flow.server._endpoints import endpoints
from agent_flow.server.models import ErrorBody
from agent_flow.server.settings import ServerSettings

__all__ = ["EVENT_STREAM", "Refusals", "complete_document"]

_REF = "#/components/schemas/{model}"
_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DESCRIPTIONS = {
    400: "Malformed request: no valid Host header or Content-Length, a body that is not JSON",
    401: "Missing or unknown bearer token",
    403: "A web page of another origin may not change anything here",
    404: "No such session (or another user's)",
    409: "Conflict with the session's state (its run, its approvals)",
    413: "Request body larger than the server's limit of {limit} bytes",
    415: "This server has no tokens, so a POST must be Content-Type: application/json "
    "(which a web page's form cannot send)",
    421: "The Host header names a host this server does not answer to",
    422: "A field is invalid (``field`` names it)",
    503: "The server is shutting down, or its session store failed (try again)",
}

#: The content of ``GET /sessions/{id}/events``: one SSE event at a time (``itemSchema``).
EVENT_STREAM: dict[str, Any] = {
    "text/event-stream": {
        "itemSchema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"type": "string", "enum": sorted(EVENT_KINDS)},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": _REF.format(model="AgentEvent")},
                },
                "id": {
                    "type": "string",
                    "pattern": "^[0-9]+$",
                    "description": "The event's id, for Last-Event-ID (an events_dropped "
                    "event has none).",
                },
            },
        }
    }
}


@dataclass(frozen=True)
class Refusals:
    """The error responses of the routes of one server.

    Attributes:
        tokens: The server needs a bearer token (401 anywhere); without, a ``POST`` must be
            JSON (415).
        max_body_bytes: The largest request body (413 above).
    """

    tokens: bool
    max_body_bytes: int

    def of(self, method: str, *statuses: int) -> dict[int | str, dict[str, Any]]:
        """The error responses of a `method` route that itself refuses with `statuses`."""
        found = {400, 421, *statuses}
        if self.tokens:
            found.add(401)
        if method in _STATE_CHANGING:
            found.add(403)
        if method == "POST":
            found.add(413)
            if not self.tokens:
                found.add(415)
        return {
            status: {
                "model": ErrorBody,
                "description": _DESCRIPTIONS[status].format(limit=self.max_body_bytes),
            }
            for status in sorted(found)
        }


def complete_document(
    document: dict[str, Any], *, config: AgentConfig, settings: ServerSettings, tokens: bool
) -> dict[str, Any]:
    """Complete FastAPI's `document` of a server of `config` and `settings` (see the module doc).

    Raises:
        RuntimeError: An event model has the name of another component (rename one).
    """
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _offered_choices(schemas["CreateSession"]["properties"], config, settings)
    union = EVENT_ADAPTER.json_schema(mode="serialization", ref_template=_REF)
    for name, schema in {**union.pop("$defs", {}), "AgentEvent": union}.items():
        if schemas.setdefault(name, schema) != schema:
            raise RuntimeError(
                f"the event model {name!r} and another component of the OpenAPI document "
                "share a name; rename one of them"
            )
    if tokens:
        components["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "A token of the server (--token, or one of --tokens-file).",
            }
        }
        # The inspector's page and files need none, but they are not in the document.
        document["security"] = [{"bearer": []}]
    return document


def _offered_choices(
    properties: dict[str, Any], config: AgentConfig, settings: ServerSettings
) -> None:
    """Narrow a new session's options to what this server offers (it refuses the rest)."""
    offered = endpoints(config, client_endpoints=settings.allow_client_endpoints).endpoints
    _choose(properties, "llm", [endpoint.name for endpoint in offered])
    if not settings.allow_client_endpoints:
        del properties["base_url"]
        _choose(properties, "model", sorted({model for each in offered for model in each.models}))
    _choose(properties, "skill", [skill.name for skill in config.skills])
    if not settings.workspace_roots:
        del properties["workspace"]


def _choose(properties: dict[str, Any], name: str, values: list[str]) -> None:
    """Let the string property `name` take only `values` (none: leave it out)."""
    if not values:
        del properties[name]
        return
    for branch in properties[name].get("anyOf", [properties[name]]):
        if branch.get("type") == "string":
            branch["enum"] = values
