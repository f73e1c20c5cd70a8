"""What one MCP server offers (tools, resources, templates, prompts) and what changed.

`Catalog` holds the server's lists as its last listing saw them. `list_catalog` fills one:
every page of tools, and of resources, resource templates and prompts when the server
declares those capabilities. `Notices` collects what the server's notifications say: which
lists changed since the last refresh (``notifications/*/list_changed``, consumed by the
connection's `refresh`) and how often each subscribed resource was updated
(``notifications/resources/updated``, a counter per URI that is never reset, so that every
agent sharing the connection can tell what it has not seen yet). It is written from the
session's notification handler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import mcp_types
from mcp import ClientSession, MCPError
from pydantic import ValidationError

from agent_flow.tools.mcp_config import ComponentKind

__all__ = ["Catalog", "ListChange", "Notices", "diff", "list_catalog", "list_tools"]

_T = TypeVar("_T")
_METHOD_NOT_FOUND = -32601


@dataclass
class Catalog:
    """A server's offer as last listed (allow/deny lists not applied)."""

    tools: list[mcp_types.Tool] = field(default_factory=list)
    resources: list[mcp_types.Resource] = field(default_factory=list)
    templates: list[mcp_types.ResourceTemplate] = field(default_factory=list)
    prompts: list[mcp_types.Prompt] = field(default_factory=list)
    capabilities: mcp_types.ServerCapabilities | None = None

    def names(self, kind: ComponentKind) -> list[str]:
        """The names of one kind of component: tool and prompt names, resource URIs."""
        if kind == "tools":
            return [tool.name for tool in self.tools]
        if kind == "prompts":
            return [prompt.name for prompt in self.prompts]
        return [str(r.uri) for r in self.resources] + [t.uri_template for t in self.templates]

    @property
    def subscribable(self) -> bool:
        """Whether the server accepts ``resources/subscribe``."""
        resources = self.capabilities.resources if self.capabilities is not None else None
        return bool(resources is not None and resources.subscribe)


@dataclass(frozen=True)
class ListChange:
    """One list of a server changed: the names (URIs for resources) added and removed."""

    server: str
    kind: ComponentKind
    added: tuple[str, ...]
    removed: tuple[str, ...]


@dataclass
class Notices:
    """What a server's notifications said since the last refresh."""

    changed: set[ComponentKind] = field(default_factory=set)
    #: Resource URI → how many ``resources/updated`` notifications named it.
    updates: dict[str, int] = field(default_factory=dict)
    #: Set whenever a notification arrives (for waiting on one without sleeping).
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    #: The last message the transport could not read (not JSON-RPC, say), and when
    #: (monotonic): a call whose answer it was waits for its timeout, which then says so.
    unreadable: tuple[float, str] | None = None

    async def handle(self, message: object) -> None:
        """The session's ``message_handler``: note list changes and resource updates."""
        if isinstance(message, Exception):
            if isinstance(message, ValidationError) and message.errors():
                what = str(message.errors()[0]["msg"])  # "Invalid JSON: lone leading ..."
            else:
                what = f"{type(message).__name__}: {(str(message).splitlines() or [''])[0]}"
            self.unreadable = (time.monotonic(), what[:300])
            return
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.changed.add("tools")
        elif isinstance(message, mcp_types.ResourceListChangedNotification):
            self.changed.add("resources")
        elif isinstance(message, mcp_types.PromptListChangedNotification):
            self.changed.add("prompts")
        elif isinstance(message, mcp_types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            self.updates[uri] = self.updates.get(uri, 0) + 1
        else:
            return
        self.arrived.set()


async def _pages(
    fetch: Callable[[mcp_types.PaginatedRequestParams | None], Awaitable[_T]],
    items: Callable[[_T], list[object]],
    cursor_of: Callable[[_T], str | None],
) -> list[object]:
    collected: list[object] = []
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await fetch(params)
        collected.extend(items(page))
        cursor = cursor_of(page)
        if not cursor or cursor in seen:  # a server repeating a cursor would loop forever
            return collected
        seen.add(cursor)


async def list_tools(client: ClientSession) -> list[mcp_types.Tool]:
    """Every page of the server's tools."""
    found = await _pages(
        lambda p: client.list_tools(params=p), lambda page: list(page.tools), _cursor
    )
    return [t for t in found if isinstance(t, mcp_types.Tool)]


def _cursor(page: mcp_types.PaginatedResult) -> str | None:
    return page.next_cursor


async def _optional(kind: str, listing: Awaitable[list[_T]]) -> list[_T]:
    """A listing a server may not implement although it declared the capability."""
    try:
        return await listing
    except MCPError as err:
        if err.code == _METHOD_NOT_FOUND:
            return []
        raise MCPError(err.code, f"listing {kind} failed: {err.message}", err.data) from err


async def list_catalog(
    client: ClientSession, kinds: set[ComponentKind] | None = None, *, into: Catalog | None = None
) -> Catalog:
    """List the server's components (`kinds`, default all it declares) into a catalog."""
    catalog = into if into is not None else Catalog()
    capabilities = client.server_capabilities
    catalog.capabilities = capabilities
    wanted = kinds if kinds is not None else {"tools", "resources", "prompts"}
    if "tools" in wanted:
        catalog.tools = await list_tools(client)
    if "resources" in wanted and capabilities is not None and capabilities.resources is not None:
        resources = await _pages(
            lambda p: client.list_resources(params=p), lambda page: list(page.resources), _cursor
        )
        catalog.resources = [r for r in resources if isinstance(r, mcp_types.Resource)]
        templates = await _optional(
            "resource templates",
            _pages(
                lambda p: client.list_resource_templates(params=p),
                lambda page: list(page.resource_templates),
                _cursor,
            ),
        )
        catalog.templates = [t for t in templates if isinstance(t, mcp_types.ResourceTemplate)]
    if "prompts" in wanted and capabilities is not None and capabilities.prompts is not None:
        prompts = await _pages(
            lambda p: client.list_prompts(params=p), lambda page: list(page.prompts), _cursor
        )
        catalog.prompts = [p for p in prompts if isinstance(p, mcp_types.Prompt)]
    return catalog


def diff(server: str, kind: ComponentKind, before: list[str], after: list[str]) -> ListChange:
    """What changed between two listings of one kind."""
    old, new = set(before), set(after)
    return ListChange(
        server=server,
        kind=kind,
        added=tuple(name for name in after if name not in old),
        removed=tuple(name for name in before if name not in new),
    )
