"""The tool registry: the names tools are registered under and their effective settings.

Registered names always fit what providers accept, ``^[a-zA-Z0-9_-]{1,64}$``: characters
outside that set become ``_`` and longer names are cut and suffixed with a hash of the full
name, so they stay distinct (`provider_tool_name`). Two tools whose names differ only in such
characters (``get.sum`` and ``get_sum``, both legal in MCP) would meet under one name; then
the one whose name had to change gets the hash suffix too (``get_sum_1a2b3c4d``), whatever
the registration order, and the other keeps its name. A tool registered twice under the
same name is a `DuplicateToolError`. Each tool's parameter schema is checked when it is
registered, so a broken schema fails there, not on the model's first call.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import jsonschema.protocols

from agent_flow._types import JsonObject
from agent_flow._utils import conforms
from agent_flow.errors import DuplicateToolError, ToolDefinitionError, UserError
from agent_flow.messages import ToolDefinition
from agent_flow.tools._truncation import _check_limit
from agent_flow.tools._validation import ArgumentsCheck, _validator, schema_key
from agent_flow.tools.base import Tool
from agent_flow.tools.base import tool as make_tool
from agent_flow.tools.policy import ToolPolicy

MAX_TOOL_NAME_LENGTH = 64
_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def provider_tool_name(name: str, *, namespace: str | None = None) -> str:
    """Return the name a tool is registered under: namespaced, provider-safe, at most 64 chars.

    ``provider_tool_name("search", namespace="github")`` is ``"github_search"``. Characters outside
    ``[a-zA-Z0-9_-]`` become ``_``; a longer name keeps its first 55 characters and gets
    ``_`` plus 8 hex digits of the SHA-256 of the full name, so distinct long names stay
    distinct and the same name always maps to the same result.

    Raises:
        ToolDefinitionError: The name is empty.
    """
    full = f"{namespace}_{name}" if namespace else name
    if not name:
        raise ToolDefinitionError("a tool name cannot be empty; give the tool a name")
    cleaned = _INVALID_NAME_CHARS.sub("_", full)
    if len(cleaned) <= MAX_TOOL_NAME_LENGTH:
        return cleaned
    return _hashed(full)


def _hashed(full: str) -> str:
    """`full` made provider-safe, cut to fit, and suffixed with 8 hex digits of its SHA-256."""
    cleaned = _INVALID_NAME_CHARS.sub("_", full)
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:8]
    return f"{cleaned[: MAX_TOOL_NAME_LENGTH - 9]}_{digest}"


def _needs_change(name: str, namespace: str | None) -> bool:
    full = f"{namespace}_{name}" if namespace else name
    return bool(name) and provider_tool_name(name, namespace=namespace) != full


def _as_tool(item: Tool | Callable[..., object]) -> Tool:
    if conforms(item, Tool):  # type: ignore[type-abstract]  # see conforms
        return item
    if callable(item):
        return make_tool(item)
    raise ToolDefinitionError(f"{item!r} is not a tool; pass a Tool or a typed function")


# Agents built per run register the same tools each time: one definition (a validated copy of
# the schema) serves them all. Keyed by content, so a changed schema gets its own.
_definitions: dict[tuple[str, str, str], ToolDefinition] = {}
_MAX_CACHED_DEFINITIONS = 1024


def _definition(name: str, description: str, parameters: JsonObject, key: str) -> ToolDefinition:
    cached = _definitions.get((name, description, key))
    if cached is None:
        if len(_definitions) >= _MAX_CACHED_DEFINITIONS:
            _definitions.clear()
        cached = ToolDefinition(name=name, description=description, parameters=parameters)
        _definitions[name, description, key] = cached
    return cached


@dataclass(frozen=True)
class RegisteredTool:
    """A tool as registered: its exposed name and effective settings.

    Attributes:
        name: The name the model calls it by.
        tool: The tool.
        policy: The effective policy (the registration's, else the tool's).
        timeout: The effective timeout (``None``: the executor's default).
        max_output_tokens: The output limit (``None``: the executor's default).
        definition: What the model is told about it.
        source_name: The name asked for (namespaced), before it was made provider-safe.
    """

    name: str
    tool: Tool
    policy: ToolPolicy
    timeout: float | None
    max_output_tokens: int | None
    definition: ToolDefinition
    validator: jsonschema.protocols.Validator
    source_name: str = ""
    # An exact fast check for flat schemas (see `_flat_check`); None: jsonschema only.
    quick_check: ArgumentsCheck | None = None

    @property
    def renamed(self) -> bool:
        """Whether `name` differs from the name asked for (characters replaced or cut)."""
        return bool(self.source_name) and self.source_name != self.name

    def _under(self, name: str) -> RegisteredTool:
        definition = self.definition.model_copy(update={"name": name})
        return dataclasses.replace(self, name=name, definition=definition)


class ToolRegistry:
    """The registered tools, by the name the model calls each one (`ToolExecutor`'s base).

    Registration order is kept: it is the order of `names` and of the definitions the model
    is shown.
    """

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """A number that changes whenever a tool is registered, renamed or unregistered.

        What is derived from the registered tools (the offered definitions, their token
        count) can be kept while it stays the same.
        """
        return self._version

    def register(
        self,
        tool: Tool | Callable[..., object],
        *,
        namespace: str | None = None,
        name: str | None = None,
        timeout: float | None = None,
        max_output_tokens: int | None = None,
        policy: ToolPolicy | None = None,
    ) -> str:
        """Register a tool and return the name the model will call it by.

        Args:
            tool: A `Tool`, or a plain function (wrapped with `@tool`).
            namespace: A prefix: ``register(search, namespace="github")`` → ``github_search``.
            name: Register under this name instead of the tool's own.
            timeout: Seconds a call may run (overrides the tool's own timeout).
            max_output_tokens: Token limit of this tool's results.
            policy: A policy overriding the tool's own.

        Raises:
            DuplicateToolError: A tool with the resulting name is already registered.
            ToolDefinitionError: The object is not a tool or its schema is invalid.
        """
        tool = _as_tool(tool)
        _check_limit(max_output_tokens)
        requested = name or tool.name
        source = f"{namespace}_{requested}" if namespace else requested
        exposed = provider_tool_name(requested, namespace=namespace)
        existing = self._tools.get(exposed)
        if existing is not None and existing.source_name != source:
            # Distinct names that met only once made provider-safe: the renamed one moves.
            if exposed != source:
                exposed = _hashed(source)
            elif existing.renamed:
                self._move(existing, _hashed(existing.source_name))
            existing = self._tools.get(exposed)
        if existing is not None:
            raise DuplicateToolError(
                f"a tool named {exposed!r} is already registered ({existing.tool!r}); "
                "register the new one with another name or a namespace"
            )
        parameters = tool.parameters
        key = schema_key(parameters)
        validator, quick_check = _validator(exposed, parameters, key)
        self._tools[exposed] = RegisteredTool(
            name=exposed,
            tool=tool,
            policy=policy or tool.policy,
            timeout=timeout if timeout is not None else tool.timeout,
            max_output_tokens=max_output_tokens,
            definition=_definition(exposed, tool.description, parameters, key),
            validator=validator,
            source_name=source,
            quick_check=quick_check,
        )
        self._version += 1
        return exposed

    def _move(self, registered: RegisteredTool, name: str) -> None:
        """Register `registered` under `name` instead, keeping the registration order."""
        if name in self._tools:
            raise DuplicateToolError(
                f"a tool named {name!r} is already registered; give one of the tools named "
                f"like {registered.source_name!r} another name"
            )
        self._tools = {
            (name if key == registered.name else key): (
                registered._under(name) if key == registered.name else value
            )
            for key, value in self._tools.items()
        }
        self._version += 1

    def register_all(
        self, tools: Iterable[Tool | Callable[..., object]], *, namespace: str | None = None
    ) -> list[str]:
        """Register several tools (all or none) and return their names.

        Raises:
            DuplicateToolError: One of the names is taken (nothing is registered then).
        """
        resolved = [_as_tool(item) for item in tools]
        # Names that need no change first, so a look-alike (``get.sum`` beside ``get_sum``)
        # is the one given a suffix, and no tool of this batch moves after its name is known.
        order = sorted(
            range(len(resolved)),
            key=lambda i: _needs_change(resolved[i].name, namespace),
        )
        names: dict[int, str] = {}
        snapshot = dict(self._tools)
        try:
            for index in order:
                names[index] = self.register(resolved[index], namespace=namespace)
        except BaseException:
            self._tools = snapshot
            self._version += 1
            raise
        return [names[index] for index in range(len(resolved))]

    def unregister(self, name: str) -> None:
        """Remove the tool registered as `name`.

        Raises:
            UserError: No tool has that name.
        """
        if self._tools.pop(name, None) is None:
            raise UserError(f"no tool named {name!r} is registered")
        self._version += 1

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._tools)

    @property
    def tools(self) -> Mapping[str, RegisteredTool]:
        """The registered tools by name (read-only view)."""
        return dict(self._tools)

    def definitions(self, *, names: Iterable[str] | None = None) -> list[ToolDefinition]:
        """What the model is told about the tools (all, or those named, in registration order).

        Raises:
            UserError: One of `names` is not registered.
        """
        if names is None:
            return [registered.definition for registered in self._tools.values()]
        wanted = set(names)
        unknown = wanted - self._tools.keys()
        if unknown:
            raise UserError(
                f"no tools named {sorted(unknown)!r} are registered; "
                f"registered: {', '.join(self._tools) or '(none)'}"
            )
        return [r.definition for n, r in self._tools.items() if n in wanted]

    def unknown_tool_message(self, name: str) -> str:
        """What the model is told when it calls `name` and no tool has that name."""
        available = list(self._tools)
        if not available:
            return f"unknown tool {name!r}; no tools are available"
        close = difflib.get_close_matches(name, available, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        listed = ", ".join(available[:40])
        more = f" and {len(available) - 40} more" if len(available) > 40 else ""
        return f"unknown tool {name!r}; {hint}available: {listed}{more}"
