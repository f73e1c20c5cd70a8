"""`MCPConnection`: the lifecycle of one MCP server session (start, call, restart, close).

The SDK's transports are anyio context managers that must be entered and left by the same
task, so each session lives in a task of its own which enters the transport and the
`ClientSession`, initializes, lists every page of tools, and then waits to be told to stop;
calls are made from any task through the session. Failures:

- an ``is_error`` result becomes an error result (kind ``"reported"``) with the server's text;
- a JSON-RPC error raised by the SDK (`mcp.MCPError`) becomes an error result naming the code;
- a call that outlives its timeout becomes a ``"timeout"`` error result; the session is then
  pinged before its next use and restarted if it does not answer;
- a server that crashes or closes the connection fails the calls in flight with a
  ``"server_unavailable"`` error result and is restarted on its next use, at most
  ``max_restarts`` times within ``restart_window`` seconds (`RestartBudget`); past that every
  call fails at once, saying when it is tried again. A server that died while idle is noticed
  when its output stream ends, so the next call restarts it first instead of failing; an HTTP
  server that no longer knows the session (it restarted) gets a new one and the request again;
- a server that does not answer its initialization within ``connect_timeout`` is a
  `MCPServerTimeoutError` naming the limit.

Errors about a server end with the last lines it printed on stderr, when it printed any.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import warnings
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self, TypeVar

import anyio
import httpx2
import mcp_types
from mcp import ClientSession, MCPDeprecationWarning, MCPError

from agent_flow._types import JsonObject
from agent_flow.errors import MCPServerError, MCPServerTimeoutError
from agent_flow.tools._mcp_catalog import Catalog, ListChange, Notices, diff, list_catalog
from agent_flow.tools._mcp_restarts import RestartBudget
from agent_flow.tools._mcp_session import _describe, _innermost, _Session
from agent_flow.tools._mcp_tool import MCPTool, _jsonable, convert_call_result
from agent_flow.tools._mcp_transport import _transport
from agent_flow.tools.base import ProgressCallback
from agent_flow.tools.mcp_config import ComponentKind, MCPServerConfig, MCPServerHTTP
from agent_flow.tools.results import ToolResult

# Logged under the public module's name: users configure MCP logs (servers' stderr included)
# on ``agent_flow.tools.mcp``.
logger = logging.getLogger("agent_flow.tools.mcp")

_R = TypeVar("_R")
_CONNECTION_CLOSED = mcp_types.CONNECTION_CLOSED
_REQUEST_TIMEOUT = mcp_types.REQUEST_TIMEOUT
_INVALID_REQUEST = mcp_types.INVALID_REQUEST
_TRANSPORT_ERRORS = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    ConnectionError,
    httpx2.TransportError,
)


class MCPConnection:
    """A connection to one MCP server: start, list, call, restart, close.

    Use as ``async with MCPConnection(config) as connection:``. After it started,
    `tools` holds one `MCPTool` per offered tool.

    Args:
        config: The server's configuration.
    """

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.name = config.name
        self._restarts = RestartBudget(config.max_restarts, config.restart_window)
        self.last_error: str | None = None
        self._session: _Session | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._closed = False
        self._opened = False
        self._tools: list[MCPTool] = []
        #: The tools the server lists that cannot be offered (an input schema that is not a
        #: JSON schema, a name listed again), by name: what is wrong with each. The others are
        #: offered as usual: one broken tool of a third-party server does not take the rest
        #: down.
        self.refused: dict[str, str] = {}
        self._catalog = Catalog()
        self._subscribed: set[str] = set()
        #: What the server's notifications said (list changes since the last `refresh`).
        self.notices = Notices()
        #: How many refreshes changed what the server offers.
        self.generation = 0

    @property
    def restarts(self) -> int:
        """How often the server was restarted (or an HTTP session made anew) so far."""
        return self._restarts.spent

    def __repr__(self) -> str:
        return f"MCPConnection({self.name!r})"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def tools(self) -> list[MCPTool]:
        """The server's offered tools (allow/deny lists applied), as agent_flow tools."""
        return list(self._tools)

    @property
    def connected(self) -> bool:
        """Whether a session is up and not known to be broken."""
        return self._session is not None and self._session.usable

    async def start(self) -> None:
        """Start the server (or connect), initialize, and list its tools.

        Raises:
            MCPServerError: The server could not be started, reached or initialized.
        """
        if self._closed:
            raise MCPServerError(f"MCP connection {self.name!r} is closed; create a new one")
        session = await self._usable_session()
        self._adopt(session.catalog)

    def _adopt(self, catalog: Catalog) -> None:
        self._catalog = catalog
        tools: list[MCPTool] = []
        refused: dict[str, str] = {}
        offered: set[str] = set()
        for remote in catalog.tools:
            if self.config.allows(remote.name):
                tool = MCPTool(self, remote)
                if remote.name in offered:
                    refused[remote.name] = (
                        f"tool {remote.name!r} is listed twice: the first is offered"
                    )
                elif tool.problem is None:
                    tools.append(tool)
                    offered.add(remote.name)
                else:
                    refused[remote.name] = tool.problem
        for name in refused.keys() - self.refused.keys():
            logger.warning("MCP server %r: %s", self.name, refused[name])
        self._tools = tools
        self.refused = refused

    @property
    def resources(self) -> list[mcp_types.Resource]:
        """The server's resources, as last listed."""
        return list(self._catalog.resources)

    @property
    def resource_templates(self) -> list[mcp_types.ResourceTemplate]:
        """The server's resource templates (URI templates), as last listed."""
        return list(self._catalog.templates)

    @property
    def prompts(self) -> list[mcp_types.Prompt]:
        """The server's prompts, as last listed."""
        return list(self._catalog.prompts)

    def names(self, kind: ComponentKind) -> list[str]:
        """What the server offers of one kind, as last listed.

        Tool names (allow/deny lists applied), prompt names, or resource URIs and URI
        templates.
        """
        if kind == "tools":
            return [tool.name for tool in self._tools]
        return self._catalog.names(kind)

    @property
    def subscribable(self) -> bool:
        """Whether the server supports resource subscriptions."""
        return self._catalog.subscribable

    async def list_remote_tools(self) -> list[mcp_types.Tool]:
        """Every tool the server lists (all pages, allow/deny lists not applied)."""
        session = await self._usable_session()
        assert session.client is not None
        return (await list_catalog(session.client, {"tools"})).tools

    async def refresh(self, *, force: bool = False) -> list[ListChange]:
        """List again what the server said changed (everything when `force`); return the changes.

        Only lists whose names changed are reported; `generation` counts the refreshes that
        changed something (agents sharing the connection compare it with what they saw).

        Raises:
            MCPServerError: The server could not be reached or failed to list.
        """
        kinds: set[ComponentKind] = (
            {"tools", "resources", "prompts"} if force else set(self.notices.changed)
        )
        self.notices.changed -= kinds
        if not kinds:
            return []
        before = self._catalog
        fresh = Catalog(
            tools=list(before.tools),
            resources=list(before.resources),
            templates=list(before.templates),
            prompts=list(before.prompts),
        )
        await self._request("list its components", lambda c: list_catalog(c, kinds, into=fresh))
        self._adopt(fresh)
        changes = [diff(self.name, k, before.names(k), fresh.names(k)) for k in sorted(kinds)]
        changes = [change for change in changes if change.added or change.removed]
        if changes:
            self.generation += 1
        return changes

    async def read_resource(self, uri: str) -> mcp_types.ReadResourceResult:
        """Read the resource `uri` (a listed one, or one a template describes).

        Raises:
            MCPServerError: The server refused (unknown URI), failed, or could not be reached.
        """
        return await self._request(f"read {uri!r}", lambda c: c.read_resource(uri))

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None
    ) -> mcp_types.GetPromptResult:
        """Render the server's prompt `name` with `arguments`.

        Raises:
            MCPServerError: The server refused (unknown prompt, missing argument), failed, or
                could not be reached.
        """
        return await self._request(
            f"render its prompt {name!r}", lambda c: c.get_prompt(name, arguments or None)
        )

    async def subscribe(self, uri: str) -> None:
        """Ask to be notified when the resource `uri` changes (``notices.updates``).

        The subscription is renewed when the server is restarted.

        Raises:
            MCPServerError: The server does not support subscriptions, refused, or could not
                be reached.
        """
        if not self._catalog.subscribable:
            raise MCPServerError(
                f"MCP server {self.name!r} does not support resource subscriptions; "
                "drop subscribe for its resources"
            )
        await self._request(f"subscribe to {uri!r}", lambda c: _subscribe(c, uri))
        self._subscribed.add(uri)

    async def _request(
        self, what: str, send: Callable[[ClientSession], Awaitable[_R]], *, again: bool = True
    ) -> _R:
        """Send one request on a usable session, bounded by the timeout; errors raise.

        A request the server refused because it no longer knows the session is sent once more,
        on a new one (`_ended`).
        """
        session = await self._usable_session()
        assert session.client is not None
        try:
            with anyio.fail_after(self.config.timeout):
                return await send(session.client)
        except TimeoutError as err:
            session.suspect = True
            raise MCPServerError(
                f"MCP server {self.name!r} did not {what} within {self.config.timeout:g}s"
            ) from err
        except MCPError as err:
            if again and self._ended(session, err):
                return await self._request(what, send, again=False)
            if err.code == _CONNECTION_CLOSED:
                session.broken = True
            raise MCPServerError(
                f"MCP server {self.name!r} could not {what}: {err.message} "
                f"(JSON-RPC error {err.code})"
            ) from err
        except _TRANSPORT_ERRORS as err:
            session.broken = True
            self.last_error = session.with_stderr(_describe(err))
            raise MCPServerError(
                f"the connection to MCP server {self.name!r} failed while trying to {what} "
                f"({type(err).__name__}); it will be restarted on the next use"
            ) from err
        except RuntimeError as err:  # the SDK's result checks (input required)
            raise MCPServerError(f"MCP server {self.name!r} could not {what}: {err}") from err
        except asyncio.CancelledError:
            session.suspect = True
            raise

    async def call_tool(
        self,
        name: str,
        arguments: JsonObject,
        *,
        timeout_seconds: float | None = None,
        progress_callback: ProgressCallback | None = None,
    ) -> ToolResult:
        """Call the server's tool `name` and convert its result; never raises for failures.

        Args:
            name: The tool's name on the server.
            arguments: Its arguments.
            timeout_seconds: Seconds the call may take (default: the config's timeout).
            progress_callback: Receives the server's progress notifications.
        """
        limit = timeout_seconds if timeout_seconds is not None else self.config.timeout

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            if progress_callback is not None:
                await progress_callback(progress, total, message)

        for attempt in (1, 2):
            try:
                session = await self._usable_session()
            except MCPServerError as err:
                return ToolResult.error(str(err), kind="server_unavailable")
            assert session.client is not None
            try:
                result = await session.client.call_tool(
                    name, arguments, read_timeout_seconds=limit, progress_callback=on_progress
                )
                break
            except MCPError as err:
                if attempt == 1 and self._ended(session, err):
                    continue  # the server never ran it: once more, on a new session
                return self._call_error(session, name, err, limit)
            except _TRANSPORT_ERRORS as err:
                session.broken = True
                self.last_error = session.with_stderr(_describe(err))
                return ToolResult.error(
                    f"the connection to MCP server {self.name!r} failed during the call to "
                    f"{name!r} ({type(err).__name__}); it will be restarted on the next call",
                    kind="server_unavailable",
                )
            except RuntimeError as err:  # the SDK's result checks (output schema, input)
                return ToolResult.error(
                    f"MCP server {self.name!r} returned an unusable result for {name!r}: {err}",
                    kind="mcp_error",
                )
            except asyncio.CancelledError:
                session.suspect = True
                raise
        return convert_call_result(result)

    def _ended(self, session: _Session, err: MCPError) -> bool:
        """Whether an HTTP server refused a request because it no longer knows the session.

        A server that restarted answers 404 to the old session's id (the SDK says "Session
        terminated"; servers say "Session not found"): the session is marked broken, so the
        next use opens a new one (counted as a restart), as the protocol asks of a client.
        """
        if not (
            isinstance(self.config, MCPServerHTTP)
            and err.code == _INVALID_REQUEST
            and "session" in err.message.lower()
        ):
            return False
        session.broken = True
        self.last_error = f"the server no longer knows the session ({err.message})"
        return True

    def _call_error(self, session: _Session, name: str, err: MCPError, limit: float) -> ToolResult:
        if err.code == _CONNECTION_CLOSED or self._ended(session, err):
            session.broken = True
            self.last_error = session.with_stderr(err.message)
            return ToolResult.error(
                f"MCP server {self.name!r} closed the connection during the call to {name!r} "
                f"({self.last_error}); it will be restarted on the next call",
                kind="server_unavailable",
            )
        if err.code == _REQUEST_TIMEOUT:
            session.suspect = True
            unreadable = self.notices.unreadable
            if unreadable is not None and time.monotonic() - unreadable[0] <= limit + 1:
                return ToolResult.error(
                    f"MCP server {self.name!r} did not answer the call to {name!r} within "
                    f"{limit:g}s; meanwhile it sent a message that could not be read "
                    f"({unreadable[1]}), most likely the answer",
                    kind="mcp_error",
                )
            return ToolResult.error(
                f"MCP server {self.name!r} did not answer the call to {name!r} within "
                f"{limit:g}s; try a smaller request",
                kind="timeout",
            )
        return ToolResult.error(
            f"MCP server {self.name!r} refused the call to {name!r}: {err.message} "
            f"(JSON-RPC error {err.code})",
            kind="mcp_error",
            data={"code": err.code, "message": err.message, "data": _jsonable(err.data)},
        )

    async def aclose(self) -> None:
        """Stop the server (or end the session); calls afterwards fail with an error result."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            self._retire(session)
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)

    # --- session management ---------------------------------------------------------------

    async def _usable_session(self) -> _Session:
        session = self._session
        if session is not None and session.usable and not session.suspect:
            return session
        async with self._lock:
            session = self._session
            if session is not None and session.output.closed and not session.broken:
                # It stopped between calls: say so, then restart it below.
                session.broken = True
                self.last_error = session.with_stderr("the server exited while idle")
            if session is not None and session.usable:
                if not session.suspect or await self._answers_ping(session):
                    session.suspect = False
                    return session
                session.broken = True
                self.last_error = f"no answer to a ping within {self.config.ping_timeout:g}s"
            if self._closed:
                raise MCPServerError(f"MCP connection {self.name!r} is closed")
            if session is not None:
                self._session = None
                self._retire(session)
            if not self._opened:
                # The first start (explicit, or lazily on the first call) is not a restart.
                self._opened = True
                return await self._keep(await self._open())
            refused = self._restarts.refusal()
            if refused is not None:
                raise MCPServerError(
                    f"MCP server {self.name!r} stopped ({self.last_error or 'no reason given'}) "
                    f"and {refused}"
                )
            self._restarts.spend()
            logger.warning(
                "restarting MCP server %r (restart %d of at most %d) after: %s",
                self.name,
                self.restarts,
                self.config.max_restarts,
                self.last_error,
            )
            return await self._keep(await self._open())

    async def _keep(self, session: _Session) -> _Session:
        """`session`, just opened, as the connection's; stopped if it was closed meanwhile."""
        if self._closed:  # `aclose` came while it started: nobody would stop it
            self._retire(session)
            if session.task is not None:  # its process stopped and waited for, as aclose does
                await asyncio.gather(session.task, return_exceptions=True)
            raise MCPServerError(f"MCP connection {self.name!r} is closed")
        self._session = session
        return session

    async def _answers_ping(self, session: _Session) -> bool:
        assert session.client is not None
        try:
            async with asyncio.timeout(self.config.ping_timeout):
                await session.client.send_ping()
        except (TimeoutError, MCPError, *_TRANSPORT_ERRORS):
            return False
        return True

    def _retire(self, session: _Session) -> None:
        session.stop.set()
        if session.task is not None and not session.task.done():
            self._retired.add(session.task)
            session.task.add_done_callback(self._retired.discard)

    async def _open(self) -> _Session:
        session = _Session()
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        session.task = asyncio.create_task(
            self._serve(session, ready), name=f"mcp-server-{self.name}"
        )
        try:
            await asyncio.shield(ready)
        except asyncio.CancelledError:
            # Nobody reads `ready` now: the error the stopped start sets is expected.
            ready.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._retire(session)
            raise
        except Exception as err:
            cause = _innermost(err)
            if isinstance(cause, MCPServerTimeoutError):
                self.last_error = session.with_stderr(str(cause))
                raise MCPServerTimeoutError(self.last_error) from err
            self.last_error = session.with_stderr(_describe(err))
            verb = "reached" if isinstance(self.config, MCPServerHTTP) else "started"
            raise MCPServerError(
                f"MCP server {self.name!r} could not be {verb}: {self.last_error}"
            ) from err
        return session

    async def _serve(self, session: _Session, ready: asyncio.Future[None]) -> None:
        """Own the transport and the client session for their whole life (one task)."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(
                    _transport(self.config, stack, session.output)
                )
                client = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self.notices.handle)
                )
                limit = self.config.connect_timeout
                try:
                    with anyio.fail_after(limit):
                        await client.initialize()
                        # Listed now, so notifications before this point are stale.
                        self.notices.changed.clear()
                        await list_catalog(client, into=session.catalog)
                        for uri in sorted(self._subscribed):
                            await _subscribe(client, uri)
                except TimeoutError as err:
                    raise MCPServerTimeoutError(
                        f"MCP server {self.name!r} did not answer its initialization and "
                        f"listing within {limit:g}s (its connect_timeout); a server that is "
                        "slow to start needs a longer connect_timeout"
                    ) from err
                session.client = client
                ready.set_result(None)
                await session.stop.wait()
        except Exception as err:
            session.broken = True
            if not ready.done():
                ready.set_exception(err)
            elif session.stop.is_set():
                # Closing a session whose server is already gone fails noisily; that is expected.
                logger.debug("MCP server %r session closed with: %s", self.name, _describe(err))
            else:
                self.last_error = session.with_stderr(_describe(err))
                logger.warning("MCP server %r session ended: %s", self.name, self.last_error)
        except asyncio.CancelledError:
            session.broken = True
            if not ready.done():
                ready.set_exception(
                    MCPServerError(f"starting MCP server {self.name!r} was cancelled")
                )
            raise


async def _subscribe(client: ClientSession, uri: str) -> None:
    # Deprecated by the SDK for the 2026-07-28 protocol era (which replaces it with
    # ``subscriptions/listen``); the handshake-era servers we speak to still serve it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await client.subscribe_resource(uri)
