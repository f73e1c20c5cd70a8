"""MCP server configurations: what to start or reach, and which of its tools to offer.

Kept apart from `agent_flow.tools.mcp` so that configs (and `AgentConfig`, which holds them)
load without importing the MCP SDK, which takes about a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agent_flow._defaults import DEFAULT_TOOL_TIMEOUT
from agent_flow.tools.policy import RiskLevel, ToolPolicy, matches_any

if TYPE_CHECKING:
    import mcp_types

__all__ = ["MCP_SERVER_CONFIG_ADAPTER", "MCPServerConfig", "MCPServerHTTP", "MCPServerStdio"]


class _ServerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,40}$")
    allow_tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] = ()
    timeout: float = Field(default=DEFAULT_TOOL_TIMEOUT, gt=0)
    connect_timeout: float = Field(default=30.0, gt=0)
    ping_timeout: float = Field(default=5.0, gt=0)
    max_restarts: int = Field(default=3, ge=0)
    required: bool = True
    policy: ToolPolicy | None = None
    tool_policies: dict[str, ToolPolicy] = Field(default_factory=dict)

    def allows(self, tool_name: str) -> bool:
        """Whether the allow and deny lists let `tool_name` through (deny wins)."""
        if matches_any(tool_name, self.deny_tools):
            return False
        return self.allow_tools is None or matches_any(tool_name, self.allow_tools)

    def policy_for(self, tool: mcp_types.Tool) -> ToolPolicy:
        """The policy of one of the server's tools.

        The first matching `tool_policies` glob wins; otherwise the server's `policy` (or the
        default policy), marked read-only when the server hints so and high-risk when it
        hints that the tool is destructive.
        """
        for pattern, policy in self.tool_policies.items():
            if matches_any(tool.name, (pattern,)):
                return policy
        if self.policy is not None:
            return self.policy
        hints = tool.annotations
        read_only = bool(hints and hints.read_only_hint)
        destructive = bool(hints and hints.destructive_hint) and not read_only
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
        max_restarts: How often the server may be restarted over the connection's life.
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
        max_restarts: How often the session may be re-established.
        required: Whether `MCPServers` fails when this server cannot be reached.
        policy: The policy of all its tools (default: from the server's hints).
        tool_policies: Policies of particular tools, by glob.
    """

    kind: Literal["http"] = "http"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)


MCPServerConfig: TypeAlias = Annotated[MCPServerStdio | MCPServerHTTP, Field(discriminator="kind")]
MCP_SERVER_CONFIG_ADAPTER: TypeAdapter[MCPServerConfig] = TypeAdapter(MCPServerConfig)
