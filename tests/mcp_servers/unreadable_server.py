"""A hand-written MCP server over stdio whose answer to a call no JSON-RPC reader takes.

It answers ``tools/call`` with a text holding an escaped lone surrogate (``"\\udcff"``, as a
server that lists undecodable file names may send): valid JSON to Python's reader, refused by
the SDK's (jiter). The SDK drops the message, so the call waits for its timeout.
"""

from __future__ import annotations

import json
import sys


def send(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def answer(request_id: object, result: object) -> None:
    send(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}))


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification
        request_id, method = message["id"], message.get("method")
        if method == "initialize":
            answer(
                request_id,
                {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "unreadable", "version": "1"},
                },
            )
        elif method == "tools/list":
            schema = {"type": "object", "properties": {}}
            answer(request_id, {"tools": [{"name": "list_files", "inputSchema": schema}]})
        elif method == "tools/call":
            text = '{"content": [{"type": "text", "text": "report-\\udcff.txt"}]}'
            send(f'{{"jsonrpc": "2.0", "id": {json.dumps(request_id)}, "result": {text}}}')
        elif method == "ping":
            answer(request_id, {})
        else:
            error = {"code": -32601, "message": f"no method {method}"}
            send(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}))


if __name__ == "__main__":
    main()
