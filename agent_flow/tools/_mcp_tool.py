"""Adapting MCP to agent_flow: `MCPTool` (a server's tool as a `Tool`) and its results.

`convert_call_result` turns an MCP result into a `ToolResult`: text as is, structured
content as the result's data (and as JSON text when there is no text), images, audio and
binary resources described (mime type, size, URI) and kept as `Attachment`s, never pasted as
base64; embedded text resources are included with their URI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import mcp_types
from pydantic import TypeAdapter

from agent_flow._types import JsonObject, JsonValue
from agent_flow._utils import compact_json
from agent_flow.errors import ToolDefinitionError
from agent_flow.tools._validation import _validator
from agent_flow.tools.base import ToolContext
from agent_flow.tools.results import Attachment, ToolResult

if TYPE_CHECKING:
    from agent_flow.tools._mcp_connection import MCPConnection


def _b64_size(data: str) -> int:
    return len(data) * 3 // 4 - data[-2:].count("=")


def convert_call_result(result: mcp_types.CallToolResult) -> ToolResult:
    """Convert an MCP tool result into a `ToolResult` (see the module docstring)."""
    parts: list[str] = []
    attachments: list[Attachment] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            kind: Literal["image", "audio"] = (
                "image" if isinstance(block, mcp_types.ImageContent) else "audio"
            )
            size = _b64_size(block.data)
            description = f"[{kind}: {block.mime_type}, {size} bytes]"
            parts.append(description)
            attachments.append(
                Attachment(
                    kind=kind,
                    description=description,
                    mime_type=block.mime_type,
                    size_bytes=size,
                    data=block.data,
                )
            )
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            uri = str(resource.uri)
            mime = resource.mime_type or "unknown type"
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(f"[resource {uri} ({mime})]\n{resource.text}")
            else:
                size = _b64_size(resource.blob)
                description = f"[resource {uri}: {mime}, {size} bytes]"
                parts.append(description)
                attachments.append(
                    Attachment(
                        kind="resource",
                        description=description,
                        mime_type=resource.mime_type,
                        uri=uri,
                        size_bytes=size,
                        data=resource.blob,
                    )
                )
        elif isinstance(block, mcp_types.ResourceLink):
            uri = str(block.uri)
            label = block.title or block.name
            description = f"[resource link: {label} {uri}" + (
                f" ({block.mime_type})]" if block.mime_type else "]"
            )
            parts.append(description)
            attachments.append(
                Attachment(
                    kind="resource_link",
                    description=description,
                    mime_type=block.mime_type,
                    uri=uri,
                    size_bytes=block.size,
                )
            )
    data: JsonValue = _JSON.validate_python(result.structured_content)
    content = "\n".join(parts)
    if not content and data is not None:
        content = compact_json(data)
    return ToolResult(
        content=content or ("(no output)" if not result.is_error else "the tool failed"),
        data=data,
        is_error=result.is_error,
        error_kind="reported" if result.is_error else None,
        attachments=tuple(attachments),
    )


_JSON: TypeAdapter[JsonValue] = TypeAdapter(JsonValue)


def _jsonable(value: object) -> JsonValue:
    try:
        return _JSON.validate_python(value)
    except ValueError:
        return repr(value)


class MCPTool:
    """One tool of an MCP server, as an agent_flow `Tool`.

    Its `name` is the server's tool name; register it with the server's name as namespace
    (`MCPServers.register` does) so the model sees ``<server>_<tool>``.
    """

    def __init__(self, connection: MCPConnection, remote: mcp_types.Tool) -> None:
        self.connection = connection
        self.remote = remote
        self.name = remote.name
        self.description = remote.description or remote.title or ""
        parameters: JsonObject = dict(remote.input_schema)
        parameters.setdefault("type", "object")
        parameters.setdefault("properties", {})
        self.parameters = parameters
        #: Why the tool cannot be offered (its schema is not a JSON schema), or None.
        self.problem: str | None = None
        try:
            _validator(remote.name, parameters)
        except ToolDefinitionError as err:
            self.problem = f"tool {remote.name!r} is not offered: {err}"
        self.policy = connection.config.policy_for(remote)
        # The connection bounds a call itself (a restart, a ping, the call); the executor's
        # limit is only a backstop above the sum, so the connection's own message comes first.
        config = connection.config
        self.timeout: float | None = (
            config.connect_timeout + config.ping_timeout + config.timeout + 5.0
        )

    def __repr__(self) -> str:
        return f"MCPTool({self.connection.name!r}, {self.name!r})"

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolResult:
        """Call the tool on its server."""
        return await self.connection.call_tool(
            self.name, arguments, progress_callback=context.report_progress
        )
