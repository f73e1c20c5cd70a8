"""Building an agent from the flags: its config, its model, and its tools (workspace, MCP).

Shared by `run`, `chat` and `tools`. The MCP SDK is imported only when a server is started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from agent_flow.agent import tool_executor_from_config
from agent_flow.cli._exit import EXIT_USAGE, _Failure
from agent_flow.config import AgentConfig, load_config
from agent_flow.errors import ConfigError
from agent_flow.llm import LLMConfig, LLMOverrides, resolve_llm_config
from agent_flow.tools import (
    MCPServerConfig,
    MCPServerHTTP,
    MCPServerStdio,
    ToolExecutor,
    Workspace,
    workspace_tools,
)


def _agent_config(args: argparse.Namespace) -> AgentConfig:
    """The config file (or defaults) with AGENT_FLOW_* variables, then the flags on top."""
    config = load_config(args.config)
    updates: dict[str, object] = {}
    flags: list[str] = []
    if getattr(args, "max_iterations", None) is not None:
        updates["max_iterations"] = args.max_iterations
        flags.append(f"--max-iterations {args.max_iterations}")
    if getattr(args, "budget", None) is not None:
        context = config.context.model_dump()
        context["max_tokens"] = args.budget
        context["reserve_output_tokens"] = min(context["reserve_output_tokens"], args.budget // 4)
        updates["context"] = context
        flags.append(f"--budget {args.budget}")
    if not updates:
        return config
    try:
        return AgentConfig.model_validate({**config.model_dump(), **updates})
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise ConfigError(f"{' '.join(flags)} gives an invalid {where}: {problem['msg']}") from err


def _llm_config(config: AgentConfig, args: argparse.Namespace) -> LLMConfig:
    """The model to call: the config's, with --model / --base-url / --api-key-env on top."""
    flags = LLMOverrides(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env)
    own = config.llm_overrides
    has_model = config.llm is not None or (own is not None and own.model is not None)
    if has_model:
        return config.resolved_llm().with_overrides(flags)
    if args.model is None:
        where = f" or set [agent] llm in {args.config}" if args.config else ""
        raise _Failure(
            EXIT_USAGE,
            f"no model is configured: pass --model NAME{where} (try `agent-flow demo` to see "
            "an agent run without one)",
        )
    merged = {
        **(own.model_dump(exclude_none=True) if own is not None else {}),
        **flags.model_dump(exclude_none=True),
    }
    return resolve_llm_config(overrides=LLMOverrides.model_validate(merged))


def _check_credentials(llm: LLMConfig) -> None:
    base_url = llm.resolved_base_url() or os.environ.get("OPENAI_BASE_URL")
    key_env = llm.resolved_api_key_env()
    if base_url is None and not os.environ.get(key_env):
        hint = "" if llm.api_key_env else " (or name another variable with --api-key-env)"
        raise _Failure(
            EXIT_USAGE,
            f"no API key: the environment variable {key_env} is not set; export it{hint}, or "
            "point --base-url at a local server such as http://localhost:11434/v1",
        )


_NAME = re.compile(r"^([A-Za-z0-9_-]{1,40})=(.+)$", re.DOTALL)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_LAUNCHERS = frozenset({"python", "python3", "node", "npx", "uvx", "uv", "bun", "bunx", "deno"})


def _server_name(tokens: Sequence[str], taken: set[str]) -> str:
    """A name for an MCP server from its command: the script or module it runs."""
    command = Path(tokens[0]).name
    candidate = command
    if command in _LAUNCHERS or command.startswith("python"):
        rest = [t for t in tokens[1:] if not t.startswith("-") or t == "-m"]
        if "-m" in rest and rest.index("-m") + 1 < len(rest):
            candidate = rest[rest.index("-m") + 1].rsplit(".", 1)[-1]
        elif rest:
            candidate = Path(rest[0]).name
    candidate = re.sub(r"\.(py|js|mjs|ts)$", "", candidate)
    candidate = re.sub(r"^(mcp[-_]server[-_]|server[-_]|mcp[-_])", "", candidate)
    candidate = re.sub(r"([-_]mcp[-_]server|[-_]server|[-_]mcp)$", "", candidate)
    candidate = re.sub(r"[^A-Za-z0-9_-]+", "_", candidate).strip("_-")[:32] or "mcp"
    name, number = candidate, 2
    while name in taken:
        name, number = f"{candidate}{number}", number + 1
    return name


def _split_mcp_spec(spec: str) -> tuple[str | None, dict[str, str], list[str]]:
    """``[name=][VAR=value ...] command args`` → the name, the environment, the command line.

    A lower-case (or dashed) ``name=`` prefix names the server, as before; ``UPPER_CASE=value``
    words before the command are environment variables, as in the shell.
    """
    try:
        tokens = shlex.split(spec)
    except ValueError as err:
        raise _Failure(EXIT_USAGE, f"--mcp {spec!r} is not a valid command line: {err}") from err
    name: str | None = None
    named = _NAME.match(tokens[0]) if tokens else None
    if named and not (_ENV_NAME.fullmatch(named.group(1)) and named.group(1).isupper()):
        name = named.group(1)
        tokens = [named.group(2), *tokens[1:]]
    env: dict[str, str] = {}
    while tokens and (assignment := _ASSIGNMENT.match(tokens[0])):
        env[assignment.group(1)] = assignment.group(2)
        tokens = tokens[1:]
    if not tokens:
        if env:
            raise _Failure(
                EXIT_USAGE,
                f"--mcp {spec!r} sets {', '.join(env)} but names no command; an UPPER_CASE "
                "prefix is an environment variable, as in the shell: name the server in "
                "lower case (--mcp 'fs=CMD ARGS') and put variables before the command",
            )
        raise _Failure(EXIT_USAGE, "--mcp needs a command, e.g. --mcp 'npx -y server-x /tmp'")
    return name, env, tokens


def _mcp_env(specs: Sequence[str]) -> dict[str, str]:
    """``--mcp-env NAME=VALUE`` (or ``NAME``: the agent's own value) as a mapping."""
    env: dict[str, str] = {}
    for spec in specs:
        name, equals, value = spec.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise _Failure(
                EXIT_USAGE,
                f"--mcp-env {spec!r} is not NAME=VALUE with a variable name of letters, digits "
                "and '_'",
            )
        if not equals:
            if name not in os.environ:
                raise _Failure(
                    EXIT_USAGE,
                    f"--mcp-env {name} passes the variable {name} on, but it is not set; set "
                    f"it or give a value: --mcp-env {name}=VALUE",
                )
            value = os.environ[name]
        env[name] = value
    return env


def _mcp_servers(
    config: AgentConfig,
    stdio: Sequence[str],
    http: Sequence[str],
    *,
    env: Sequence[str] = (),
    timeout: float | None = None,
) -> list[MCPServerConfig]:
    """The servers of the config and of the flags, with --mcp-env and --mcp-timeout applied."""
    servers: list[MCPServerConfig] = list(config.mcp_servers)
    taken = {server.name for server in servers}
    for spec in stdio:
        given, variables, tokens = _split_mcp_spec(spec)
        name = given or _server_name(tokens, taken)
        if name in taken:
            raise _Failure(EXIT_USAGE, f"two MCP servers are named {name!r}; use --mcp 'NAME=...'")
        taken.add(name)
        servers.append(
            MCPServerStdio(
                name=name, command=tokens[0], args=tuple(tokens[1:]), env=variables or None
            )
        )
    for spec in http:
        named = _NAME.match(spec.strip())
        url = named.group(2) if named else spec.strip()
        if not url.startswith(("http://", "https://")):
            raise _Failure(EXIT_USAGE, f"--mcp-http {spec!r} is not an http(s) URL")
        name = named.group(1) if named else _server_name(["http"], taken)
        if name in taken:
            raise _Failure(
                EXIT_USAGE, f"two MCP servers are named {name!r}; use --mcp-http NAME=URL"
            )
        taken.add(name)
        servers.append(MCPServerHTTP(name=name, url=url))
    extra = _mcp_env(env)
    adjusted: list[MCPServerConfig] = []
    for server in servers:
        updates: dict[str, object] = {}
        if extra and isinstance(server, MCPServerStdio):
            updates["env"] = {**(server.env or {}), **extra}
        if timeout is not None:
            updates["connect_timeout"] = timeout
            updates["timeout"] = timeout
        adjusted.append(server.model_copy(update=updates) if updates else server)
    return adjusted


@dataclass
class _Tools:
    executor: ToolExecutor
    workspace: Workspace | None
    sources: dict[str, str]


async def _tools(
    args: argparse.Namespace, config: AgentConfig, stack: contextlib.AsyncExitStack
) -> _Tools:
    """The tool executor with the workspace tools and the MCP servers' tools, started."""
    executor = tool_executor_from_config(config.model_copy(update={"workspace": None}))
    sources: dict[str, str] = {}
    directory = args.workspace or config.workspace
    workspace = Workspace(directory) if directory else None
    if workspace is not None:
        for name in executor.register_all(workspace_tools(workspace, shell=config.shell)):
            sources[name] = "workspace"
    servers = _mcp_servers(
        config,
        args.mcp,
        args.mcp_http,
        env=getattr(args, "mcp_env", ()),
        timeout=getattr(args, "mcp_timeout", None),
    )
    if servers:
        # The MCP SDK takes about a second to import: only when a server is started.
        from agent_flow.tools import MCPServers

        started = await stack.enter_async_context(MCPServers(servers))
        for server, connection in started.connections.items():
            for name in executor.register_all(connection.tools, namespace=server):
                sources[name] = f"mcp:{server}"
    return _Tools(executor, workspace, sources)
