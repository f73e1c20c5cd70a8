"""The MCP side of one agent: its servers, what it registered from them, and their changes.

`AgentMCP` starts the servers of ``config.mcp_servers`` (those ``config.mcp.clients``
allows) or uses servers shared with other agents (`MCPServers` passed to the agent), and
applies the agent's `MCPFilter`: only allowed servers' tools, not excluded by
``exclude_components``, are registered (as ``<server>_<tool>``); the resource tools are
registered when an allowed server has resources; the configured resources are loaded into
the environment; skills whose system prompt is an MCP prompt get its text.

Between steps, `refresh` lists again what a server said changed (``list_changed``), brings
the registered tools in line, and loads again subscribed resources the server updated; the
loop publishes what it found (`MCPListChanged`, `EnvironmentUpdated`).

Agents may share one `ToolExecutor`: their servers and registrations are held through the
executor's `MCPPool` (`agent_flow.agent._mcp_pool`), so a second agent uses a server the first
started with the same config, a server stops when the last agent using it closes, and each
agent offers only what it registered itself (`hidden`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_flow.agent._mcp_pool import pool_of
from agent_flow.config import AgentConfig, Skill
from agent_flow.environment import Environment, EnvironmentChange
from agent_flow.errors import ConfigError, MCPServerError
from agent_flow.tools import MCPFilter, ToolExecutor
from agent_flow.tools.mcp_config import ComponentKind, MCPPromptRef, add_server_secrets

if TYPE_CHECKING:
    from agent_flow.tools.mcp import ListChange, MCPConnection, MCPServers

__all__ = ["AgentMCP", "MCPRefresh"]


@dataclass
class MCPRefresh:
    """What one refresh found: list changes (as the agent sees them) and reloads."""

    changes: list[ListChange] = field(default_factory=list)
    environment: list[tuple[str, list[EnvironmentChange]]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class AgentMCP:
    """The MCP servers one agent uses, filtered, and the names it registered from them.

    Args:
        config: The agent's config (``mcp_servers`` and ``mcp``).
        tools: The agent's tool executor (possibly shared with other agents).
        shared: Servers started by the application and shared with other agents (never
            started or stopped here).
        current_run: The id of the run the agent is executing (None between runs): a call
            of a tool registered once for the agents sharing `tools` runs this agent's own
            when it belongs to that run.
    """

    def __init__(
        self,
        config: AgentConfig,
        tools: ToolExecutor,
        *,
        shared: MCPServers | None = None,
        current_run: Callable[[], str | None] | None = None,
    ) -> None:
        self.config = config
        self.settings = config.mcp
        self.filter = MCPFilter(
            clients=self.settings.clients, exclude=self.settings.exclude_components
        )
        self.tools = tools
        self.shared = shared
        self._pool = pool_of(tools)
        self._current_run = current_run
        #: The servers this agent holds in the pool (started by it or by an agent sharing
        #: `tools`): a view, stopped by the pool when nobody holds them.
        self.owned: MCPServers | None = None
        #: Registered tool name → (server, the tool's name on the server).
        self.registered: dict[str, tuple[str, str]] = {}
        # Registered name → what the pool holds it as.
        self._keys: dict[str, Hashable] = {}
        self._hidden: tuple[int, frozenset[str]] = (-1, frozenset())
        self.skills: dict[str, Skill] = {}
        self._resource_tools: list[str] = []
        # What this agent last saw of each server: its generation, its visible resources and
        # prompts, and the update count of each resource.
        self._generations: dict[str, int] = {}
        self._views: dict[tuple[str, ComponentKind], list[str]] = {}
        self._updates: dict[str, int] = {}
        # Tools each server lists but cannot offer, as last reported; and the reports the
        # next `refresh` hands to the run (a warning event each).
        self._refused: dict[str, set[str]] = {}
        self._warnings: list[str] = []

    @property
    def needed(self) -> bool:
        """Whether the agent must be started before it runs: its config or shared servers."""
        config = self.config
        return bool(
            config.mcp_servers
            or self.shared is not None
            or config.mcp.resources
            or any(skill.mcp_prompt is not None for skill in config.skills)
        )

    def current_run(self) -> str | None:
        """The id of the run the agent is executing now (None between runs)."""
        return self._current_run() if self._current_run is not None else None

    def hidden(self) -> frozenset[str]:
        """Tools other agents sharing the executor registered and this one did not.

        This agent neither offers nor calls them: it sees what its own ``config.mcp`` allows.
        """
        version, names = self._hidden
        if version != self._pool.version:
            names = self._pool.hidden_from(self)
            self._hidden = (self._pool.version, names)
        return names

    @property
    def connections(self) -> dict[str, MCPConnection]:
        """The started servers this agent may use, by name."""
        found: dict[str, MCPConnection] = {}
        for servers in (self.shared, self.owned):
            if servers is not None:
                found.update(servers.connections)
        return {name: c for name, c in found.items() if self.filter.allows_server(name)}

    async def start(self, environment: Environment) -> None:
        """Start the owned servers, register what the agent may use, load, resolve skills.

        Raises:
            MCPServerError: A required server could not be started, or a configured resource
                or prompt could not be read.
            ConfigError: A resource or skill names a server the agent cannot use, or a
                server of the config runs for another agent sharing the tool executor with
                another config.
            DuplicateToolError: A server's tool name is already registered (not by an agent
                sharing the tool executor and the server).
        """
        from agent_flow.tools.mcp import MCPServers

        configs = [c for c in self.config.mcp_servers if self.filter.allows_server(c.name)]
        if configs:
            held = await self._pool.acquire(self, configs)
            self.owned = MCPServers(held.values())
        try:
            for server, connection in self.connections.items():
                self._register_tools(server, connection, [t.name for t in connection.tools])
                self._note_refused(server, connection)
                self._seen(server, connection)
            self._sync_resource_tools()
            for load in self.settings.resources:
                connection = self._connection(load.server, f"resource {load.uri!r}")
                await self._load(environment, connection, load.uri, load.into)
                if load.subscribe:
                    await connection.subscribe(load.uri)
            for skill in self.config.skills:
                if skill.mcp_prompt is not None:
                    text = await self.render_prompt(skill.mcp_prompt)
                    self.skills[skill.name] = skill.model_copy(update={"system_prompt": text})
        except BaseException:
            await self.aclose()
            raise

    async def render_prompt(self, ref: MCPPromptRef) -> str:
        """The text of a server's prompt rendered with its arguments.

        Raises:
            ConfigError: The server is not available to the agent, or the prompt is excluded.
            MCPServerError: The server refused or failed.
        """
        from agent_flow.tools.mcp_resources import prompt_text

        connection = self._connection(ref.server, f"prompt {ref.name!r}")
        if not self.filter.allows(ref.server, "prompts", ref.name):
            raise ConfigError(
                f"prompt {ref.name!r} of MCP server {ref.server!r} is excluded for this agent "
                "(exclude_components)"
            )
        return prompt_text(await connection.get_prompt(ref.name, dict(ref.arguments)))

    def _connection(self, server: str, what: str) -> MCPConnection:
        connection = self.connections.get(server)
        if connection is None:
            available = ", ".join(sorted(self.connections)) or "none"
            raise ConfigError(
                f"{what} names MCP server {server!r}, which this agent cannot use "
                f"(available: {available}); add it to mcp_servers and mcp.clients"
            )
        return connection

    async def _load(
        self, environment: Environment, connection: MCPConnection, uri: str, into: str
    ) -> list[EnvironmentChange]:
        from agent_flow.tools.mcp_resources import load_resource, resource_record

        if not self.filter.allows(connection.name, "resources", uri):
            raise ConfigError(
                f"resource {uri!r} of MCP server {connection.name!r} is excluded for this agent"
            )
        result = await connection.read_resource(uri)
        name = next((r.name for r in connection.resources if str(r.uri) == uri), None)
        before = environment.version
        load_resource(
            environment,
            resource_record(connection.name, uri, result, name=name),
            into="workspace" if into == "workspace" else "knowledge",
        )
        return environment.changes(since_version=before)

    def _register_tools(self, server: str, connection: MCPConnection, names: list[str]) -> None:
        add_server_secrets(self.tools, connection.config)
        wanted = set(names)
        for tool in connection.tools:
            if tool.name in wanted and self.filter.allows(server, "tools", tool.name):
                # The same tool of the same connection: agents sharing both share this.
                key = ("tool", connection, tool.name)
                registered = self._pool.register(self.tools, self, key, tool, namespace=server)
                self.registered[registered] = (server, tool.name)
                self._keys[registered] = key

    def _let_go(self, registered: str) -> None:
        key = self._keys.pop(registered, None)
        if key is not None:
            self._pool.unregister(self.tools, self, key)

    def _unregister(self, server: str, names: set[str]) -> list[str]:
        gone = [r for r, (s, name) in self.registered.items() if s == server and name in names]
        for registered in gone:
            del self.registered[registered]
            self._let_go(registered)
        return gone

    def _sync_resource_tools(self) -> None:
        """Offer the resource tools while an allowed server has resources, and not otherwise."""
        from agent_flow.tools.mcp_resources import (
            READ_RESOURCE_TOOL,
            resource_handler,
            resource_tools,
        )

        wanted = self.settings.resource_tools and any(
            c.resources or c.resource_templates for c in self.connections.values()
        )
        if wanted and not self._resource_tools:
            for tool in resource_tools(lambda: self.connections, self.filter):
                key = ("resource_tool", tool.name)
                if tool.name in self.tools and not self._pool.holds(key):
                    continue  # the application's own tool of that name stays
                # One registration for the agents sharing the executor; each call runs the
                # calling agent's own (its servers, its filter).
                self._pool.register(self.tools, self, key, tool, per_agent=True)
                self._keys[tool.name] = key
                self._resource_tools.append(tool.name)
            patterns = [p for p, _ in self.tools.handlers.handlers_for(READ_RESOURCE_TOOL)]
            if READ_RESOURCE_TOOL not in patterns:
                self.tools.handlers.register(READ_RESOURCE_TOOL, resource_handler())
        elif not wanted and self._resource_tools:
            for name in self._resource_tools:
                self._let_go(name)
            self._resource_tools = []

    async def refresh(self, environment: Environment) -> MCPRefresh:
        """List again what servers said changed; re-register tools; reload updated resources.

        What the agent sees is compared with what it saw last, not with the connection's
        last refresh: agents sharing a connection each take up every change. A server that
        fails to list is reported in ``warnings`` and kept as it was.
        """
        found = MCPRefresh()
        if self.owned is None and self.shared is None:
            return found
        for server, connection in self.connections.items():
            if connection.notices.changed:
                connection.notices.arrived.clear()
                try:
                    await connection.refresh()
                except MCPServerError as err:
                    found.warnings.append(str(err))
            if connection.generation != self._generations.get(server, 0):
                self._generations[server] = connection.generation
                found.changes += self._take_up(server, connection)
            for load in self.settings.resources:
                if load.server != server or not load.subscribe:
                    continue
                updates = connection.notices.updates.get(load.uri, 0)
                if updates == self._updates.get(load.uri, 0):
                    continue
                self._updates[load.uri] = updates
                try:
                    written = await self._load(environment, connection, load.uri, load.into)
                except MCPServerError as err:
                    found.warnings.append(str(err))
                    continue
                if written:
                    found.environment.append((f"mcp:{server}", written))
        if found.changes:
            self._sync_resource_tools()
        # Tools a server cannot offer, found when the agent started or in this refresh.
        found.warnings[:0], self._warnings = self._warnings, []
        return found

    def _note_refused(self, server: str, connection: MCPConnection) -> None:
        """Report once each tool of `server` the agent may use but the server cannot offer."""
        refused = {n for n in connection.refused if self.filter.allows(server, "tools", n)}
        for name in sorted(refused - self._refused.get(server, set())):
            self._warnings.append(f"MCP server {server!r}: {connection.refused[name]}")
        self._refused[server] = refused

    def _seen(self, server: str, connection: MCPConnection) -> None:
        """Remember what the agent sees of `server` now (after start or a change)."""
        self._generations[server] = connection.generation
        for kind in ("resources", "prompts"):
            self._views[(server, kind)] = self._visible(server, connection, kind)
        for uri, count in connection.notices.updates.items():
            self._updates.setdefault(uri, count)

    def _visible(self, server: str, connection: MCPConnection, kind: ComponentKind) -> list[str]:
        return [n for n in connection.names(kind) if self.filter.allows(server, kind, n)]

    def _take_up(self, server: str, connection: MCPConnection) -> list[ListChange]:
        """Bring the agent's view of `server` in line with the connection's lists."""
        from agent_flow.tools._mcp_catalog import diff
        from agent_flow.tools.mcp import ListChange

        changes: list[ListChange] = []
        mine = {name for s, name in self.registered.values() if s == server}
        now = self._visible(server, connection, "tools")
        removed = self._unregister(server, mine - set(now))
        before = set(self.registered)
        self._register_tools(server, connection, [n for n in now if n not in mine])
        self._note_refused(server, connection)
        added = [name for name in self.registered if name not in before]
        if added or removed:
            changes.append(ListChange(server, "tools", tuple(added), tuple(removed)))
        for kind in ("resources", "prompts"):
            old = self._views.get((server, kind), [])
            new = self._visible(server, connection, kind)
            self._views[(server, kind)] = new
            change = diff(server, kind, old, new)
            if change.added or change.removed:
                changes.append(change)
        return changes

    async def aclose(self) -> None:
        """Let go of what this agent registered and of its servers.

        Registrations and servers no other agent sharing the executor holds are unregistered
        and stopped.
        """
        for name in [*self.registered, *self._resource_tools]:
            self._let_go(name)
        self.registered, self._resource_tools = {}, []
        self.owned = None
        await self._pool.release(self)
