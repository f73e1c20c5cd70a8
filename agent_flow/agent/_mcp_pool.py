"""What the agents sharing one `ToolExecutor` hold of MCP together: servers and registrations.

Several agents may share one tool executor. Each one's MCP servers and the tools registered
from them go through the executor's `MCPPool` (`pool_of`), which counts who holds what:

- a server of an agent's config that already runs for another agent of the executor, with
  the same config, is used as it is (not started again); one with the same name and another
  config is refused. A server stops when the last agent holding it closes, in whatever order
  the agents close;
- a tool registered from a server (or the resource tools) is registered once, and
  unregistered when the last agent holding it lets go, so closing one agent never takes a
  tool from another. A resource tool is one registration for all of them that runs the
  calling agent's own (its servers, its filter), found by the run a call belongs to;
- `MCPPool.hidden_from` names what an agent does not hold itself: it is neither offered nor
  callable by that agent, so each agent sees what its own ``[agent.mcp]`` allows.

Bookkeeping is synchronous (one event loop); only starting servers awaits, under a lock, so
two agents starting together do not start the same server twice. Runtime machinery, never
serialized.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agent_flow._types import JsonObject
from agent_flow.errors import ConfigError
from agent_flow.tools.base import BaseTool, Tool, ToolContext, ToolOutput

if TYPE_CHECKING:
    from agent_flow.tools import ToolExecutor
    from agent_flow.tools.mcp import MCPConnection
    from agent_flow.tools.mcp_config import MCPServerConfig

__all__ = ["Holder", "MCPPool", "pool_of"]


class Holder(Protocol):
    """An agent's MCP side, as the pool sees it."""

    def current_run(self) -> str | None:
        """The id of the run the agent is executing now (None between runs)."""
        ...


@dataclass(eq=False)
class _Server:
    connection: MCPConnection
    holders: set[Holder] = field(default_factory=set)


@dataclass(eq=False)
class _Registration:
    name: str
    #: Each holder's own tool (the same object for a server's tool; its own resource tool).
    tools: dict[Holder, Tool] = field(default_factory=dict)


class _PerAgent(BaseTool):
    """One registration of a tool every agent has its own of: runs the calling agent's."""

    def __init__(self, pool: MCPPool, key: Hashable, first: Tool) -> None:
        self._pool = pool
        self._key = key
        self.name = first.name
        self.description = first.description
        self.parameters = first.parameters
        self.policy = first.policy
        self.timeout = first.timeout

    def __repr__(self) -> str:
        return f"<{self.name} of the agents sharing this executor>"

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolOutput:
        return await self._pool.tool_for(self._key, context.run_id).run(arguments, context)


class MCPPool:
    """The MCP servers and registrations held by the agents of one tool executor.

    Get one with `pool_of`; `AgentMCP` is its only user.
    """

    def __init__(self) -> None:
        self._servers: dict[str, _Server] = {}
        self._registrations: dict[Hashable, _Registration] = {}
        self._lock: asyncio.Lock | None = None
        #: Changes whenever a holder takes or lets go of a registration.
        self.version = 0

    # -- servers ---------------------------------------------------------------------------

    async def acquire(
        self, holder: Holder, configs: Iterable[MCPServerConfig]
    ) -> dict[str, MCPConnection]:
        """Hold the servers of `configs`: those running already as they are, the others started.

        All or nothing: when it raises, `holder` holds none of them.

        Raises:
            ConfigError: A server of that name runs for another agent with another config.
            MCPServerError: A required server could not be started.
        """
        from agent_flow.tools.mcp import MCPServers

        wanted = list(configs)
        if self._lock is None:
            # Made while no agent holds anything, so it belongs to the loop in use now.
            self._lock = asyncio.Lock()
        async with self._lock:
            for config in wanted:
                running = self._servers.get(config.name)
                if running is not None and running.connection.config != config:
                    raise ConfigError(
                        f"MCP server {config.name!r} already runs for another agent of this "
                        "tool executor, configured differently; give the servers different "
                        "names, or the same configuration to share one"
                    )
            reused = [self._servers[c.name] for c in wanted if c.name in self._servers]
            for server in reused:
                server.holders.add(holder)
            new = [c for c in wanted if c.name not in self._servers]
            try:
                started = MCPServers(new)
                if new:
                    await started.start()  # stops what it started when it fails
            except BaseException:
                await self._let_go(holder, reused)
                raise
            for name, connection in started.connections.items():
                self._servers[name] = _Server(connection, {holder})
        return {
            config.name: self._servers[config.name].connection
            for config in wanted
            if config.name in self._servers and holder in self._servers[config.name].holders
        }

    async def release(self, holder: Holder) -> None:
        """Let go of every server `holder` holds; stop those nobody holds any more."""
        await self._let_go(holder, [s for s in self._servers.values() if holder in s.holders])

    async def _let_go(self, holder: Holder, servers: list[_Server]) -> None:
        unheld: list[MCPConnection] = []
        for server in servers:
            server.holders.discard(holder)
            if not server.holders:
                del self._servers[server.connection.name]
                unheld.append(server.connection)
        if not self._servers and not self._registrations and not self._locked():
            self._lock = None  # the next agent may run in another event loop
        # Taken out of the pool first: an agent starting meanwhile starts its own. Shielded:
        # out of the pool, a server a cancel kept from closing would run on with no owner.
        await asyncio.shield(asyncio.gather(*(c.aclose() for c in unheld), return_exceptions=True))

    def _locked(self) -> bool:
        return self._lock is not None and self._lock.locked()

    # -- registrations ---------------------------------------------------------------------

    def register(
        self,
        tools: ToolExecutor,
        holder: Holder,
        key: Hashable,
        tool: Tool,
        *,
        namespace: str | None = None,
        per_agent: bool = False,
    ) -> str:
        """Hold the registration of `tool` under `key`, registering it if nobody holds it yet.

        `key` says what the tool is (a server's tool: its connection and name), so another
        agent's registration of the same is shared. With `per_agent`, each holder's `tool`
        runs for its own calls (`tool_for`).

        Returns:
            The registered name.

        Raises:
            DuplicateToolError: Another tool has that name.
        """
        registration = self._registrations.get(key)
        if registration is not None and registration.name not in tools:
            del self._registrations[key]  # unregistered behind the pool's back
            registration = None
        if registration is None:
            registered = _PerAgent(self, key, tool) if per_agent else tool
            registration = _Registration(tools.register(registered, namespace=namespace))
            self._registrations[key] = registration
        registration.tools[holder] = tool
        self.version += 1
        return registration.name

    def unregister(self, tools: ToolExecutor, holder: Holder, key: Hashable) -> None:
        """Let go of `holder`'s registration under `key`; unregister it when nobody holds it."""
        registration = self._registrations.get(key)
        if registration is None or registration.tools.pop(holder, None) is None:
            return
        if not registration.tools:
            del self._registrations[key]
            if registration.name in tools:
                tools.unregister(registration.name)
        self.version += 1

    def holds(self, key: Hashable) -> bool:
        """Whether some agent holds a registration under `key`."""
        return key in self._registrations

    def tool_for(self, key: Hashable, run_id: str) -> Tool:
        """The holder's own tool registered under `key` for a call of run `run_id`.

        A call outside any holder's run (an executor used directly) gets the first holder's.
        """
        tools = self._registrations[key].tools
        for holder, tool in tools.items():
            if run_id and holder.current_run() == run_id:
                return tool
        return next(iter(tools.values()))

    def hidden_from(self, holder: Holder) -> frozenset[str]:
        """The registered names `holder` does not hold (other agents' MCP tools)."""
        return frozenset(
            registration.name
            for registration in self._registrations.values()
            if holder not in registration.tools
        )


_POOLS: weakref.WeakKeyDictionary[ToolExecutor, MCPPool] = weakref.WeakKeyDictionary()


def pool_of(tools: ToolExecutor) -> MCPPool:
    """The pool of the agents sharing `tools` (made on first use; it lives as long)."""
    pool = _POOLS.get(tools)
    if pool is None:
        pool = _POOLS[tools] = MCPPool()
    return pool
