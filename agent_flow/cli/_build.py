"""Building an agent from the flags: its config, its model, and its tools (workspace, MCP).

Shared by `run`, `chat` and `tools`. MCP servers from the flags join the config's, and the
agent starts them itself when it is entered (`_start_agent`), as a library user's agent
does; the MCP SDK is imported only then.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError

from agent_flow.agent import AgentExecutor, tool_executor_from_config
from agent_flow.cli._exit import EXIT_USAGE, _Failure, _flag_failure
from agent_flow.config import AgentConfig, ConfigWarning, load_config
from agent_flow.errors import ConfigError, ContextBudgetError
from agent_flow.llm import LLMConfig, LLMOverrides, OpenAIClient, resolve_llm_config
from agent_flow.tools import (
    MCPServerConfig,
    MCPServerHTTP,
    MCPServerStdio,
    ToolExecutor,
    Workspace,
    workspace_tools,
)


def _load_config(path: str | None, warn: Callable[[str], None]) -> AgentConfig:
    """`load_config`, with each `ConfigWarning` (a misspelt variable) passed to `warn`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        config = load_config(path)
    for warning in caught:
        if issubclass(warning.category, ConfigWarning):
            warn(str(warning.message))
        else:  # not ours to swallow
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    return config


def _agent_config(
    args: argparse.Namespace,
    warn: Callable[[str], None],
    base: AgentConfig | None = None,
) -> AgentConfig:
    """The config (`base`, else the file or defaults with AGENT_FLOW_* variables), flags on top."""
    config = base if base is not None else _load_config(args.config, warn)
    updates: dict[str, object] = {}
    flags: list[str] = []
    if getattr(args, "max_iterations", None) is not None:
        updates["max_iterations"] = args.max_iterations
        flags.append(f"--max-iterations {args.max_iterations}")
    if getattr(args, "budget", None) is not None:
        # Only what the user set is kept: an unset output reserve scales with the new budget.
        context = config.context.model_dump(exclude_unset=True)
        context["max_tokens"] = args.budget
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


async def _fit_to_server_context(
    config: AgentConfig,
    client: OpenAIClient,
    provider: str,
    args: argparse.Namespace,
    warn: Callable[[str], None],
) -> AgentConfig:
    """The config with its budget cut to the context the model server reports, if smaller.

    Says so once (`warn`). See `agent_flow.cli._server_context` for which servers are asked.

    Raises:
        _Failure: The server's context is smaller than the configured output reserve.
    """
    from agent_flow.cli._server_context import server_context, worth_asking

    if not worth_asking(provider, client.base_url):
        return config
    found = await server_context(client)
    budget = config.context.max_tokens
    if found is None or found.tokens >= budget:
        return config
    given = (
        f"--budget {budget:,}"
        if getattr(args, "budget", None) is not None
        else f"the budget of {budget:,} tokens"
    )
    context = config.context.model_dump(exclude_unset=True)
    context["max_tokens"] = found.tokens
    try:
        fitted = AgentConfig.model_validate({**config.model_dump(), "context": context})
    except ValidationError as err:
        raise _Failure(
            EXIT_USAGE,
            f"the model server holds only {found.tokens:,} tokens ({found.source}), less than "
            f"the context settings allow: {err.errors()[0]['msg']}; lower "
            "reserve_output_tokens, or start the server with a larger context",
        ) from err
    warn(
        f"the model server holds {found.tokens:,} tokens per request ({found.source}), fewer "
        f"than {given}: prompts are budgeted to {found.tokens:,} tokens"
    )
    return fitted


async def _warn_if_server_context_is_smaller(
    client: OpenAIClient, budget: int, args: argparse.Namespace, warn: Callable[[str], None]
) -> None:
    """For an --agent's own budget, which the command cannot change: say once if too large."""
    from agent_flow.cli._server_context import server_context, worth_asking

    if not worth_asking(getattr(args, "provider", None), client.base_url):
        return
    found = await server_context(client)
    if found is not None and found.tokens < budget:
        warn(
            f"the model server holds {found.tokens:,} tokens per request ({found.source}), "
            f"fewer than the budget of --agent {args.agent} ({budget:,} tokens): prompts it "
            "rejects or cuts are likely; build the agent with "
            f"ContextConfig(max_tokens={found.tokens})"
        )


def _llm_config(config: AgentConfig, args: argparse.Namespace) -> LLMConfig:
    """The model to call: the config's, with --model / --base-url / --api-key-env on top."""
    try:
        flags = LLMOverrides(
            provider=getattr(args, "provider", None),
            model=args.model,
            base_url=args.base_url,
            api_key_env=args.api_key_env,
            timeout=getattr(args, "timeout", None),
        )
    except ValidationError as err:  # e.g. --model "$MODEL" with MODEL unset
        raise _flag_failure(err) from None
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


def _check_base_url(url: str | None, *, flag: str | None, config_url: str | None) -> None:
    """Refuse a base URL that is not an http(s) URL with a host (a usage error, exit 2).

    Without the scheme (``localhost:8080/v1``) the SDK would fail every attempt and the run
    would end as an unreachable model (exit 3) after its retries.

    Args:
        url: The URL requests would go to.
        flag: The ``--base-url`` value, if given.
        config_url: The config's own ``base_url``, if any.
    """
    if url is None:
        return
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.hostname:
        return
    if flag is not None and url == flag:
        where = "--base-url"
    elif config_url is not None and url == config_url:
        where = "base_url (in the config)"
    else:
        where = "OPENAI_BASE_URL"
    fix = "http://" + url.split("://", 1)[-1]
    raise _Failure(
        EXIT_USAGE,
        f"{where} {url!r} is not an http:// or https:// URL with a host; give the whole URL, "
        f"e.g. {fix if urlsplit(fix).hostname else 'http://localhost:8080/v1'}",
    )


def _check_credentials(llm: LLMConfig, flag: str | None, base_url_flag: str | None = None) -> None:
    """Refuse early when the key the run would send is missing, or the base URL is no URL.

    Args:
        llm: The model config.
        flag: The ``--api-key-env`` value, if given.
        base_url_flag: The ``--base-url`` value, if given.
    """
    if llm.api_key_env and not os.environ.get(llm.api_key_env):
        # A variable named on purpose is never silently skipped, even for a local server.
        named = "--api-key-env" if flag else "api_key_env (in the config)"
        raise _Failure(
            EXIT_USAGE,
            f"{named}: the environment variable {llm.api_key_env} is not set; export it, or "
            f"leave out {named.split(' ')[0]} for a server that needs no key",
        )
    try:
        base_url = llm.resolved_base_url()
    except ConfigError as err:
        raise _Failure(EXIT_USAGE, str(err)) from None
    _check_base_url(base_url, flag=base_url_flag, config_url=llm.base_url)
    key_env = llm.resolved_api_key_env()
    if base_url is None and not os.environ.get(key_env):
        hint = "" if llm.api_key_env else " (or name another variable with --api-key-env)"
        raise _Failure(
            EXIT_USAGE,
            f"no API key: the environment variable {key_env} is not set; export it{hint}, or "
            "point --base-url at a local server such as http://localhost:11434/v1",
        )


def _check_budget(fixed: Callable[[], object], args: argparse.Namespace, budget: int) -> None:
    """Refuse a budget the system prompt and the tool schemas alone do not fit (a usage error).

    Args:
        fixed: Computes what is left after the fixed parts; raises `ContextBudgetError`.
        args: The flags (to say where the budget came from).
        budget: The budget in force.
    """
    try:
        fixed()
    except ContextBudgetError as err:
        where = (
            f"--budget {args.budget}"
            if getattr(args, "budget", None) is not None
            else f"the context budget max_tokens = {budget}"
        )
        raise _Failure(
            EXIT_USAGE,
            f"{where} is too small for this agent: the system prompt and the tool schemas "
            f"alone need {err.needed:,} tokens and it leaves {err.available:,} after the "
            f"output reserve; give a budget well above {budget - err.available + err.needed:,}"
            " tokens",
        ) from err


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
    """The agent's tools as the flags describe them.

    Attributes:
        config: The config with every MCP server: its own and those of ``--mcp`` and
            ``--mcp-http``.
        executor: The tool executor, with the workspace tools.
        workspace: The workspace of ``--workspace`` or the config, if any.
        sources: Where each tool comes from, by name (``workspace``; ``mcp:<server>`` once
            the agent started its servers).
    """

    config: AgentConfig
    executor: ToolExecutor
    workspace: Workspace | None
    sources: dict[str, str]


def _tools(
    args: argparse.Namespace, config: AgentConfig, *, into: ToolExecutor | None = None
) -> _Tools:
    """The tool executor with the workspace tools, and the config with the flags' servers.

    The MCP servers are not started here: the agent starts those of its config when it is
    entered (`_start_agent`), the same path a Python user takes.

    Args:
        args: The flags (``--workspace``, ``--mcp``, ``--mcp-http``).
        config: The agent's config (its workspace and MCP servers).
        into: Add the tools to this executor (an ``--agent``'s own) instead of a new one.
    """
    executor = (
        into
        if into is not None
        else tool_executor_from_config(config.model_copy(update={"workspace": None}))
    )
    sources: dict[str, str] = {}
    # An --agent's own executor has its configured workspace tools already.
    directory = args.workspace or (config.workspace if into is None else None)
    workspace = Workspace(directory) if directory else None
    if workspace is not None:
        for name in executor.register_all(workspace_tools(workspace, shell=config.shell)):
            sources[name] = "workspace"
    servers = tuple(
        _mcp_servers(
            config,
            args.mcp,
            args.mcp_http,
            env=getattr(args, "mcp_env", ()),
            timeout=getattr(args, "mcp_timeout", None),
        )
    )
    return _Tools(config.model_copy(update={"mcp_servers": servers}), executor, workspace, sources)


async def _start_agent(
    agent: AgentExecutor, tools: _Tools, stack: contextlib.AsyncExitStack
) -> None:
    """Enter the agent on `stack` (it starts its MCP servers) and note where their tools are."""
    await stack.enter_async_context(agent)
    for name, server in agent.mcp_tools.items():
        tools.sources[name] = f"mcp:{server}"
