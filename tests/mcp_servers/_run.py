"""Run a test MCP server over stdio (default) or streamable HTTP on 127.0.0.1.

``python <server>.py http [PORT]`` binds PORT (default: a free one), prints it on stdout as the
first line, then serves; the test reads the port and stops the process when done.
"""

from __future__ import annotations

import socket
import sys

import anyio
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server


def run(server: MCPServer) -> None:
    """Serve `server` on the transport named by the first command-line argument."""
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if transport == "stdio":
        server.run()
        return
    anyio.run(_serve_http, server)


def run_stdio(server: Server) -> None:
    """Serve a low-level `Server` (its handlers written by hand) over stdio."""

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)


async def _serve_http(server: MCPServer) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0))
    sock.listen(64)
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    # The socket is listening already, so the port is usable as soon as it is printed.
    print(sock.getsockname()[1], flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])
