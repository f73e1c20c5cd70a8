"""The offline demo behind `agent-flow demo`: its scripted run and its MCP server.

- `agent_flow._demo.scenario`: the generated project, the model's script and `run_demo`;
- `agent_flow._demo.mcp_server`: a small, real MCP server (code search and a Python linter),
  run over stdio with ``python -m agent_flow._demo.mcp_server --root DIR``.

Nothing is imported here, so that starting the MCP server loads neither the agent nor rich.
"""
