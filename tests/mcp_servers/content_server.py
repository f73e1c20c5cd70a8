"""An MCP server returning images, embedded resources and resource links."""

from __future__ import annotations

import base64

from _run import run
from mcp.server.mcpserver import Image, MCPServer
from mcp_types import (
    BlobResourceContents,
    EmbeddedResource,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

server = MCPServer("content")

# A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


@server.tool()
def picture() -> Image:
    """Return a PNG image."""
    return Image(data=PNG, format="png")


@server.tool()
def documents() -> list[TextContent | EmbeddedResource | ResourceLink]:
    """Return text, an embedded text resource, an embedded blob and a resource link."""
    return [
        TextContent(type="text", text="here are the documents"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="file:///notes.txt", mime_type="text/plain", text="remember the milk"
            ),
        ),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(
                uri="file:///data.bin",
                mime_type="application/octet-stream",
                blob=base64.b64encode(b"\x00" * 300).decode(),
            ),
        ),
        ResourceLink(
            type="resource_link",
            uri="https://example.com/report.pdf",
            name="report",
            mime_type="application/pdf",
        ),
    ]


if __name__ == "__main__":
    run(server)
