"""MCP configuration: servers (what to start or reach, which tools to offer) and an agent's use.

`MCPServerStdio` and `MCPServerHTTP` describe servers. `MCPAgentSettings` (the ``[agent.mcp]``
table) says how one agent uses them: which servers (``clients``), which of their components
are hidden from it (``exclude_components``, see `agent_flow.tools.filters.MCPFilter`),
whether the model gets the resource tools, and which resources are loaded into its
environment at start (`MCPResourceLoad`). `MCPPromptRef` names a server's prompt that seeds
a skill's system prompt.

Kept apart from `agent_flow.tools.mcp` so that configs (and `AgentConfig`, which holds them)
load without importing the MCP SDK, which takes about a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agent_flow._defaults import DEFAULT_TOOL_TIMEOUT, MCP_RESTART_WINDOW_SECONDS
from agent_flow.tools.policy import RiskLevel, ToolPolicy, matches_any

if TYPE_CHECKING:
    import mcp_types

    from agent_flow.tools.executor import ToolExecutor

__all__ = [
    "MCP_SERVER_CONFIG_ADAPTER",
    "MCPAgentSettings",
    "MCPPromptRef",
    "MCPResourceLoad",
    "MCPServerConfig",
    "MCPServerHTTP",
    "MCPServerStdio",
    "add_server_secrets",
]


class _ServerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,40}$")
    allow_tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] = ()
    timeout: float = Field(default=DEFAULT_TOOL_TIMEOUT, gt=0)
    connect_timeout: float = Field(default=30.0, gt=0)
    ping_timeout: float = Field(default=5.0, gt=0)
    max_restarts: int = Field(default=3, ge=0)
    restart_window: float | None = Field(default=MCP_RESTART_WINDOW_SECONDS, gt=0)
    required: bool = True
    policy: ToolPolicy | None = None
    tool_policies: dict[str, ToolPolicy] = Field(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        """Count the ``kind`` tag as given, however the config was built.

        Copies made with ``exclude_unset`` (a server's per-session config, a run enqueued for
        a durable worker) must still say which kind of server this is, or they no longer
        validate: a tag left to its default would be dropped from them.
        """
        self.__pydantic_fields_set__.add("kind")

    def allows(self, tool_name: str) -> bool:
        """Whether the allow and deny lists let `tool_name` through (deny wins)."""
        if matches_any(tool_name, self.deny_tools):
            return False
        return self.allow_tools is None or matches_any(tool_name, self.allow_tools)

    def policy_for(self, tool: mcp_types.Tool) -> ToolPolicy:
        """The policy of one of the server's tools.

        The first matching `tool_policies` glob wins; otherwise the server's `policy`;
        otherwise one from the tool's annotations, read with the MCP spec's defaults: read-only
        only when ``readOnlyHint`` is true, and high-risk (so it needs approval under the
        default `PolicyEngine`) unless it is read-only or ``destructiveHint`` is false. A tool
        without annotations is therefore high-risk, as the spec says to assume.
        """
        for pattern, policy in self.tool_policies.items():
            if matches_any(tool.name, (pattern,)):
                return policy
        if self.policy is not None:
            return self.policy
        # The spec's defaults for a tool without hints: not read-only, destructive
        # (``destructiveHint`` matters only when ``readOnlyHint`` is false).
        hints = tool.annotations
        read_only = bool(hints and hints.read_only_hint)
        destructive_hint = hints.destructive_hint if hints is not None else None
        destructive = not read_only and destructive_hint is not False
        return ToolPolicy(
            read_only=read_only, risk=RiskLevel.HIGH if destructive else RiskLevel.LOW
        )


class MCPServerStdio(_ServerConfig):
    """An MCP server run as a subprocess speaking over stdin/stdout.

    Attributes:
        name: The server's name, also the namespace of its tools.
        command: The executable.
        args: Its arguments.
        env: Extra environment variables (over a minimal safe inherited set).
        cwd: Its working directory.
        stderr_log: A file the server's stderr is appended to (default: the logger).
        allow_tools: Only these tools (globs) are offered; ``None`` offers all.
        deny_tools: These of the server's tools (globs on its own names) are never
            registered; to deny a registered ``<server>_<tool>``, use `AgentConfig.deny_tools`.
        timeout: Seconds a call may take.
        connect_timeout: Seconds starting and initializing may take.
        ping_timeout: Seconds a liveness ping may take after a call timed out.
        max_restarts: How often the server may be restarted within `restart_window`.
        restart_window: Seconds a restart counts against `max_restarts` (None: for the
            connection's life). Past the limit, calls fail at once until the oldest restart
            leaves the window.
        required: Whether `MCPServers` fails when this server cannot start (else it skips it).
        policy: The policy of all its tools (default: from the server's hints).
        tool_policies: Policies of particular tools, by glob.
    """

    kind: Literal["stdio"] = "stdio"
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    stderr_log: str | None = None


class MCPServerHTTP(_ServerConfig):
    """An MCP server reached over streamable HTTP.

    Attributes:
        name: The server's name, also the namespace of its tools.
        url: The endpoint, e.g. ``http://127.0.0.1:8000/mcp``.
        headers: Headers sent with every request (e.g. authorization).
        allow_tools: Only these tools (globs) are offered; ``None`` offers all.
        deny_tools: These of the server's tools (globs on its own names) are never
            registered; to deny a registered ``<server>_<tool>``, use `AgentConfig.deny_tools`.
        timeout: Seconds a call may take.
        connect_timeout: Seconds initializing may take.
        ping_timeout: Seconds a liveness ping may take after a call timed out.
        max_restarts: How often the session may be re-established within `restart_window`.
        restart_window: Seconds a re-establishment counts against `max_restarts` (None: for
            the connection's life).
        required: Whether `MCPServers` fails when this server cannot be reached.
        policy: The policy of all its tools (default: from the server's hints).
        tool_policies: Policies of particular tools, by glob.
    """

    kind: Literal["http"] = "http"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)


MCPServerConfig: TypeAlias = Annotated[MCPServerStdio | MCPServerHTTP, Field(discriminator="kind")]
MCP_SERVER_CONFIG_ADAPTER: TypeAdapter[MCPServerConfig] = TypeAdapter(MCPServerConfig)


ComponentKind: TypeAlias = Literal["tools", "resources", "prompts"]


class MCPResourceLoad(BaseModel):
    """A server's resource loaded into the agent's environment when the agent starts.

    Attributes:
        server: The server's name.
        uri: The resource's URI.
        into: ``knowledge`` (``/knowledge/extra/mcp_resources/<uri>``, and the URI among
            ``/knowledge/sources``) or ``workspace`` (``/workspace/extra/mcp_resources/<uri>``).
        subscribe: Subscribe to the resource (where the server supports it) and load it again,
            between steps, when the server says it changed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str = Field(min_length=1)
    uri: str = Field(min_length=1)
    into: Literal["knowledge", "workspace"] = "knowledge"
    subscribe: bool = False


class MCPPromptRef(BaseModel):
    """A server's prompt, rendered with `arguments` (see `agent_flow.config.Skill`).

    Attributes:
        server: The server's name.
        name: The prompt's name on the server.
        arguments: The prompt's arguments (MCP prompt arguments are strings).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: dict[str, str] = Field(default_factory=dict)


class MCPAgentSettings(BaseModel):
    """How one agent uses MCP servers (the ``[agent.mcp]`` table).

    Attributes:
        clients: The servers (name globs) this agent may use; ``None``: all of them. Another
            server's tools, resources and prompts are not offered to it.
        exclude_components: Components hidden from this agent although their server is
            allowed: globs on ``<server>/<name>`` or ``<name>`` (a tool's or prompt's name on
            its server, a resource's URI or a template's URI template), optionally restricted
            to one kind by a ``tool:``, ``prompt:`` or ``resource:`` prefix, e.g.
            ``"tool:docs/delete_*"``, ``"prompt:*/internal"``, ``"resource:notes://secret/*"``.
        resource_tools: Offer the model ``mcp_list_resources`` and ``mcp_read_resource`` when
            an allowed server has resources (its reads land in the environment).
        resources: Resources loaded into the environment when the agent starts.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    clients: tuple[str, ...] | None = None
    exclude_components: tuple[str, ...] = ()
    resource_tools: bool = True
    resources: tuple[MCPResourceLoad, ...] = ()


def add_server_secrets(executor: ToolExecutor, config: MCPServerConfig) -> None:
    """Redact from `executor`'s results what the server was given (`SecretRedactor.add_server`)."""
    env = config.env if isinstance(config, MCPServerStdio) else None
    headers = config.headers if isinstance(config, MCPServerHTTP) else {}
    executor.secrets.add_server(config.name, env, headers)
