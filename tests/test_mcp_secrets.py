"""What an MCP server was given to authenticate does not come back to the model through it.

A server may echo its own environment or the headers it received (a debug tool, an error that
quotes its request). The agent's own secrets were redacted from every tool result already; the
values the config gave the server (secret-looking ``env`` entries, credential headers) are too,
over stdio (through an agent) and over HTTP (through `MCPServers.register`).
"""

from __future__ import annotations

from pathlib import Path

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.history import ToolResultEntry
from agent_flow.testing import ScriptedLLM, call, reply
from agent_flow.tools import MCPServerHTTP, MCPServers, ToolExecutor, ToolPolicy
from agent_flow.tools._secrets import SecretRedactor
from tests.helpers import start_http_server, stdio_server, stop_process
from tests.helpers import tool_call as model_call

TOKEN = "ghp_given_to_the_server_only_0123"
PLAIN = "a-plain-setting-0123456789"


async def test_a_stdio_servers_secret_env_values_are_redacted_from_its_results() -> None:
    server = stdio_server("vault", "env_server.py", env={"GH_TOKEN": TOKEN, "MODE": PLAIN})
    llm = ScriptedLLM(
        [
            reply(
                tool_calls=[
                    call("vault_getenv", name="GH_TOKEN"),
                    call("vault_getenv", name="MODE"),
                ]
            ),
            "done",
        ]
    )
    agent = AgentExecutor(
        llm, config=AgentConfig(context=ContextConfig(counter="approx"), mcp_servers=(server,))
    )
    async with agent:
        await agent.run("read the settings")
    results = [e.content for e in agent.history.entries if isinstance(e, ToolResultEntry)]
    assert results == ["[REDACTED:vault.GH_TOKEN]", PLAIN]
    assert TOKEN not in repr(agent.history.entries) and TOKEN not in str(llm.requests)


async def test_an_http_servers_credential_headers_are_redacted_from_its_results(
    tmp_path: Path,
) -> None:
    with (tmp_path / "http_server.log").open("w") as log:
        port, process = await start_http_server(log)
        try:
            config = MCPServerHTTP(
                name="web",
                url=f"http://127.0.0.1:{port}/mcp",
                headers={"Authorization": f"Bearer {TOKEN}", "X-Api-Key": PLAIN, "X-Trace": PLAIN},
                policy=ToolPolicy(),
            )
            executor = ToolExecutor(secrets=SecretRedactor())
            async with MCPServers([config]) as servers:
                servers.register(executor)
                answers = [
                    (await executor.execute_one(model_call("web_header", {"name": name}))).result
                    for name in ("authorization", "x-api-key")
                ]
        finally:
            await stop_process(process)
    assert [a.content for a in answers] == [
        "[REDACTED:web.Authorization]",
        "[REDACTED:web.X-Api-Key]",
    ]


def test_a_bearer_token_is_redacted_alone_too_and_plain_headers_are_not() -> None:
    redactor = SecretRedactor()
    redactor.add_server("web", None, {"Authorization": f"Bearer {TOKEN}", "X-Trace": PLAIN})
    assert redactor.redact(f"token={TOKEN}; trace={PLAIN}") == (
        f"token=[REDACTED:web.Authorization]; trace={PLAIN}"
    )
    # Registered again (an agent's tools are, on every list change): nothing new to compile.
    compiled = redactor._compiled()
    redactor.add_server("web", None, {"Authorization": f"Bearer {TOKEN}"})
    assert redactor._compiled() is compiled
