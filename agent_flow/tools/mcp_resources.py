"""MCP resources and prompts for an agent: two tools, a handler, and loading by config.

MCP makes tools model-controlled, resources application-controlled and prompts
user-controlled; agent_flow follows that split:

- resources reach the environment, where every prompt shows them within the budget: the
  application loads them at start (``[[agent.mcp.resources]]``, `load_resource`), and the
  model may look for more with ``mcp_list_resources`` and read one with ``mcp_read_resource``
  (`resource_tools`), whose result `resource_handler` writes into the environment;
- prompts are not offered to the model: a prompt seeds a skill's system prompt
  (`agent_flow.config.Skill.mcp_prompt`, or `AgentExecutor.skill_from_mcp_prompt`), with
  `prompt_text` rendering the server's messages.

A loaded resource is a record ``{"server", "uri", "name", "mime_type", "text", "truncated",
"binary"}`` at ``/knowledge/extra/mcp_resources/<uri>`` (its URI also among
``/knowledge/sources``) or ``/workspace/extra/mcp_resources/<uri>``. Text is cut to
`MAX_RESOURCE_CHARS`; binary contents are described (type, size), never pasted as base64.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

import mcp_types

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import MCPServerError
from agent_flow.messages import ToolCall
from agent_flow.tools.base import BaseTool, ToolContext
from agent_flow.tools.filters import MCPFilter
from agent_flow.tools.handlers import ResultHandler
from agent_flow.tools.policy import ToolPolicy
from agent_flow.tools.results import ToolResult

if TYPE_CHECKING:
    from agent_flow.environment import Environment
    from agent_flow.tools._mcp_connection import MCPConnection

__all__ = [
    "MAX_RESOURCE_CHARS",
    "MCP_RESOURCES_KEY",
    "READ_RESOURCE_TOOL",
    "load_resource",
    "prompt_text",
    "resource_handler",
    "resource_record",
    "resource_tools",
]

#: The most characters of a resource's text kept in the environment.
MAX_RESOURCE_CHARS = 8000
#: The key under a section's ``extra`` where loaded resources are kept.
MCP_RESOURCES_KEY = "mcp_resources"
#: The name of the tool reading a resource (its results go through `resource_handler`).
READ_RESOURCE_TOOL = "mcp_read_resource"
LIST_RESOURCES_TOOL = "mcp_list_resources"

Into = Literal["knowledge", "workspace"]


def resource_record(
    server: str,
    uri: str,
    result: mcp_types.ReadResourceResult,
    *,
    name: str | None = None,
    max_chars: int = MAX_RESOURCE_CHARS,
) -> JsonObject:
    """The environment record of a read resource (see the module docstring)."""
    texts: list[str] = []
    binary: list[JsonValue] = []
    mime: str | None = None
    for content in result.contents:
        mime = mime or content.mime_type
        if isinstance(content, mcp_types.TextResourceContents):
            texts.append(content.text)
        else:
            binary.append(
                {"uri": str(content.uri), "mime_type": content.mime_type, "size": _size(content)}
            )
    text = "\n".join(texts)
    return {
        "server": server,
        "uri": uri,
        "name": name or uri,
        "mime_type": mime,
        "text": text[:max_chars],
        "truncated": len(text) > max_chars,
        "binary": binary,
    }


def _size(content: mcp_types.BlobResourceContents) -> int:
    try:
        return len(base64.b64decode(content.blob, validate=False))
    except (binascii.Error, ValueError):
        return len(content.blob) * 3 // 4


def _pointer_token(uri: str) -> str:
    return uri.replace("~", "~0").replace("/", "~1")


def load_resource(environment: Environment, record: JsonObject, *, into: Into) -> None:
    """Write a resource `record` into the environment's `into` section (``extra``)."""
    uri = str(record["uri"])
    environment.set(f"/{into}/extra/{MCP_RESOURCES_KEY}/{_pointer_token(uri)}", record)
    if into == "knowledge":
        label = f"{record['server']}: {record['name']}"
        if environment.knowledge.sources.get(label) != uri:
            environment.set(f"/knowledge/sources/{_pointer_token(label)}", uri)


def resource_handler(*, into: Into = "knowledge") -> ResultHandler:
    """A result handler loading what ``mcp_read_resource`` read into the environment."""

    def handle(environment: Environment, call: ToolCall, result: ToolResult) -> None:
        if not result.is_error and isinstance(result.data, dict) and "uri" in result.data:
            load_resource(environment, result.data, into=into)

    return handle


def prompt_text(result: mcp_types.GetPromptResult) -> str:
    """A rendered prompt as one text: its messages' text, embedded text resources included."""
    parts: list[str] = []
    for message in result.messages:
        content = message.content
        if isinstance(content, mcp_types.TextContent):
            parts.append(content.text)
        elif isinstance(content, mcp_types.EmbeddedResource):
            resource = content.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(f"[resource {resource.uri}]\n{resource.text}")
            else:
                parts.append(f"[resource {resource.uri}: {resource.mime_type or 'binary'}]")
        else:
            parts.append(f"[{content.type}]")
    return "\n\n".join(parts)


Connections = Callable[[], Mapping[str, "MCPConnection"]]


class _ResourceTool(BaseTool):
    policy = ToolPolicy(read_only=True)

    def __init__(self, connections: Connections, mcp_filter: MCPFilter) -> None:
        self._connections = connections
        self._filter = mcp_filter

    def _allowed(self) -> dict[str, MCPConnection]:
        return {
            name: connection
            for name, connection in self._connections().items()
            if self._filter.allows_server(name)
        }


class _ListResources(_ResourceTool):
    name = LIST_RESOURCES_TOOL
    description = (
        "List the resources (documents, records) of the connected MCP servers, and the URI "
        "templates of resources that can be read by filling in the template."
    )
    parameters: JsonObject = {  # noqa: RUF012 - read-only
        "type": "object",
        "properties": {"server": {"type": "string", "description": "Only this server's."}},
    }

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolResult:
        only = arguments.get("server")
        lines: list[str] = []
        data: list[JsonValue] = []
        for server, connection in self._allowed().items():
            if only is not None and server != only:
                continue
            for resource in connection.resources:
                uri = str(resource.uri)
                if self._filter.allows(server, "resources", uri):
                    about = resource.description or resource.title or resource.name
                    lines.append(f"{server} {uri} ({resource.mime_type or '?'}): {about}")
                    data.append({"server": server, "uri": uri, "name": resource.name})
            for template in connection.resource_templates:
                if self._filter.allows(server, "resources", template.uri_template):
                    about = template.description or template.name
                    lines.append(f"{server} template {template.uri_template}: {about}")
                    data.append({"server": server, "uri_template": template.uri_template})
        if not lines:
            return ToolResult(content="no resources", data=[])
        return ToolResult(content="\n".join(lines), data=data)


class _ReadResource(_ResourceTool):
    name = READ_RESOURCE_TOOL
    description = (
        "Read a resource of an MCP server by its URI (a listed one, or a template filled in); "
        "its text is kept in the environment."
    )
    parameters: JsonObject = {  # noqa: RUF012 - read-only
        "type": "object",
        "properties": {
            "server": {"type": "string", "description": "The server's name."},
            "uri": {"type": "string", "description": "The resource's URI."},
        },
        "required": ["server", "uri"],
    }

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolResult:
        server, uri = str(arguments["server"]), str(arguments["uri"])
        connection = self._allowed().get(server)
        if connection is None:
            known = ", ".join(sorted(self._allowed())) or "none"
            return ToolResult.error(
                f"no MCP server {server!r} is available; available: {known}",
                kind="invalid_arguments",
            )
        if not self._filter.allows(server, "resources", uri) or not _listed_or_templated(
            self._filter, server, connection, uri
        ):
            return ToolResult.error(
                f"resource {uri!r} of {server!r} is not available to this agent",
                kind="denied",
            )
        try:
            result = await connection.read_resource(uri)
        except MCPServerError as err:
            return ToolResult.error(str(err), kind="mcp_error")
        name = next((r.name for r in connection.resources if str(r.uri) == uri), None)
        record = resource_record(server, uri, result, name=name)
        text = str(record["text"]) or "(no text)"
        return ToolResult(content=f"[resource {server} {uri}]\n{text}", data=record)


def _listed_or_templated(
    mcp_filter: MCPFilter, server: str, connection: MCPConnection, uri: str
) -> bool:
    """Whether `uri` is listed, or comes from a template the filter lets through.

    A resource filled in from an excluded template is excluded too: the filter names the
    template, not every URI it makes.
    """
    if any(str(r.uri) == uri for r in connection.resources):
        return True
    templates = connection.resource_templates
    for template in templates:
        prefix = template.uri_template.split("{", 1)[0]
        if uri.startswith(prefix) and not mcp_filter.allows(
            server, "resources", template.uri_template
        ):
            return False
    return True  # servers may serve URIs they do not list; the server decides


def resource_tools(connections: Connections, mcp_filter: MCPFilter | None = None) -> list[BaseTool]:
    """``mcp_list_resources`` and ``mcp_read_resource`` over `connections` (a live view).

    Register them with a `ToolExecutor`, and `resource_handler` for ``mcp_read_resource``
    on its handlers, so that reads land in the environment.
    """
    chosen = mcp_filter if mcp_filter is not None else MCPFilter()
    return [_ListResources(connections, chosen), _ReadResource(connections, chosen)]
