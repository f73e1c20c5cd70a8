"""Result handlers: how tool results update the Environment.

An agent's handlers are ``agent.handlers``, the registry of its tool executor, which starts
with the built-in handlers below: add yours with ``agent.handlers.register("tool", fn)`` or
``@agent.handler("tool")``, and the built-in ones keep running for the other tools.

A `HandlerRegistry` maps tool names (exact names or globs such as ``"*_search"``) to
functions ``handler(environment, call, result)`` that write to the environment through its
pointer API. After a turn's calls have run, the executor applies, for each successful result
(in call order), every handler whose pattern matches the tool's registered name, in
registration order; when none matches, the registry's default handler runs. Handlers receive
the full, untruncated result.

A handler that raises never loses the result: the model still receives it, the error is
returned as a `HandlerError`, and the handler's partial writes stay as recorded changes.

Built-in handlers:

- `directory_tree_handler` (``directory_tree``, ``*_directory_tree``): a tree result fills
  ``/workspace/files`` (path → `FileInfo`). It accepts the ``directory_tree`` tool's data
  (``{"root", "entries": [{"path", "kind", "size"}], "complete"}``) and the text-tree form
  (``{"tree": ["hal/", "  ├── src/", ...]}``). When the listing is complete, files under its
  root that it no longer shows are removed.
- `search_results_handler` (``search``, ``*_search``): each result's
  snippet or title is added to ``/knowledge/discovered_facts`` (deduplicated, newest kept
  within a cap) and, when it has a URL, ``/knowledge/sources`` gets title → URL.
- `record_latest_result` (the default): the latest result of each tool is stored at
  ``/extensions/tool_results/<tool name>`` as ``{"call_id", "content", "data", "truncated"}``
  with the content cut to a character limit and the data kept only when its JSON fits one.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from pydantic import BaseModel, ConfigDict

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment import EnvironmentChange, FileInfo
from agent_flow.messages import ToolCall
from agent_flow.tools.results import ToolResult

if TYPE_CHECKING:
    from agent_flow.environment import Environment

__all__ = [
    "TOOL_RESULTS_EXTENSION",
    "HandlerError",
    "HandlerRegistry",
    "HandlerReport",
    "ResultHandler",
    "directory_tree_handler",
    "parse_text_tree",
    "record_latest_result",
    "search_results_handler",
]

#: Where `record_latest_result` stores results: ``/extensions/tool_results/<tool name>``.
TOOL_RESULTS_EXTENSION = "tool_results"

#: A result handler: writes what the result teaches into the environment.
ResultHandler: TypeAlias = Callable[["Environment", ToolCall, ToolResult], None]


class HandlerError(BaseModel):
    """A handler raised while applying a result.

    Attributes:
        handler: The handler's qualified name.
        pattern: The tool-name pattern it was registered under (``"*"`` for the default).
        tool_name: The tool whose result it was handling.
        call_id: The call.
        error_type: The exception's class name.
        message: The exception's message.
    """

    model_config = ConfigDict(frozen=True)

    handler: str
    pattern: str
    tool_name: str
    call_id: str
    error_type: str
    message: str


@dataclass
class HandlerReport:
    """What applying the handlers to one result did."""

    changes: list[EnvironmentChange] = field(default_factory=list)
    errors: list[HandlerError] = field(default_factory=list)


_MAX_MATCHED = 1024


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class HandlerRegistry:
    """Maps tool names (or globs) to result handlers.

    Args:
        default: The handler for results no pattern matches (``None``: leave them alone).
    """

    def __init__(self, *, default: ResultHandler | None = None) -> None:
        self.default = default
        self._handlers: list[tuple[str, ResultHandler]] = []
        #: The registered pairs each tool name matched, until the next registration; bounded
        #: (tool names come from the model), cleared when full.
        self._matched: dict[str, tuple[tuple[str, ResultHandler], ...]] = {}

    @classmethod
    def with_defaults(cls, *, max_facts: int = 200, max_chars: int = 4000) -> HandlerRegistry:
        """A registry with the built-in handlers and `record_latest_result` as the default.

        Args:
            max_facts: The most discovered facts the search handler keeps.
            max_chars: The content limit of the default handler's records.
        """

        def search(env: Environment, call: ToolCall, result: ToolResult) -> None:
            search_results_handler(env, call, result, max_facts=max_facts)

        def record(env: Environment, call: ToolCall, result: ToolResult) -> None:
            record_latest_result(env, call, result, max_chars=max_chars)

        registry = cls(default=record)
        registry.register("directory_tree", directory_tree_handler)
        registry.register("*_directory_tree", directory_tree_handler)
        for pattern in ("search", "*_search"):
            registry.register(pattern, search)
        return registry

    def register(self, pattern: str, handler: ResultHandler) -> None:
        """Run `handler` for results of tools whose registered name matches `pattern`."""
        self._handlers.append((pattern, handler))
        self._matched.clear()

    def handler(self, pattern: str) -> Callable[[ResultHandler], ResultHandler]:
        """Register the decorated function for `pattern` and return it unchanged.

        ``@registry.handler("load_csv")`` above ``def dataset_loaded(env, call, result)``
        is ``registry.register("load_csv", dataset_loaded)``.
        """

        def register(handler: ResultHandler) -> ResultHandler:
            self.register(pattern, handler)
            return handler

        return register

    def handlers_for(self, tool_name: str) -> list[tuple[str, ResultHandler]]:
        """The ``(pattern, handler)`` pairs that apply to `tool_name`, in registration order."""
        matched = self._matched.get(tool_name)
        if matched is None:
            matched = tuple(
                (pattern, handler)
                for pattern, handler in self._handlers
                if pattern == tool_name or fnmatch.fnmatchcase(tool_name, pattern)
            )
            if len(self._matched) >= _MAX_MATCHED:
                self._matched.clear()
            self._matched[tool_name] = matched
        if not matched and self.default is not None:
            return [("*", self.default)]
        return list(matched)

    def apply(self, environment: Environment, call: ToolCall, result: ToolResult) -> HandlerReport:
        """Apply every matching handler to `result`; never raises for a handler's failure."""
        report = HandlerReport()
        tool_name = result.tool_name or call.name
        for pattern, handler in self.handlers_for(tool_name):
            before = environment.version
            try:
                handler(environment, call, result)
            except Exception as err:  # a handler bug must not lose the result or stop the loop
                report.errors.append(
                    HandlerError(
                        handler=getattr(handler, "__qualname__", repr(handler)),
                        pattern=pattern,
                        tool_name=tool_name,
                        call_id=call.id,
                        error_type=type(err).__name__,
                        message=str(err),
                    )
                )
            report.changes.extend(environment.changes(since_version=before))
        return report


# --- the generic default ------------------------------------------------------------------


def record_latest_result(
    environment: Environment,
    call: ToolCall,
    result: ToolResult,
    *,
    max_chars: int = 4000,
) -> None:
    """Store the latest result of a tool at ``/extensions/tool_results/<tool name>``.

    The content is cut to `max_chars` characters; the data is kept only if its JSON fits in
    `max_chars` too (``data_omitted`` says when it did not).
    """
    content = result.content
    truncated = len(content) > max_chars
    if truncated:
        content = content[:max_chars]
    data: JsonValue = result.data
    data_omitted = False
    if data is not None and len(json.dumps(data, ensure_ascii=False)) > max_chars:
        data, data_omitted = None, True
    record: JsonObject = {
        "call_id": call.id,
        "content": content,
        "truncated": truncated,
        "data": data,
        "data_omitted": data_omitted,
    }
    tool_name = result.tool_name or call.name
    environment.set(f"/extensions/{TOOL_RESULTS_EXTENSION}/{_escape(tool_name)}", record)


# --- directory trees ----------------------------------------------------------------------

_TREE_DRAWING = re.compile(r"^[\s│├└─|`\\+-]*")


def parse_text_tree(lines: list[str]) -> list[tuple[str, bool]]:
    """Parse an indented or box-drawn tree into ``(path, is_directory)`` pairs.

    A line's nesting is the column where its name starts; a name ending in ``/`` is a
    directory. A single top line that contains every other line (``"hal/"``) is the root and
    is not part of the paths.
    """
    parsed: list[tuple[int, str]] = []
    for line in lines:
        if not line.strip():
            continue
        prefix = _TREE_DRAWING.match(line)
        column = prefix.end() if prefix else 0
        name = line[column:].strip()
        if name:
            parsed.append((column, name))
    if not parsed:
        return []
    strip_root = parsed[0][1].endswith("/") and all(col > parsed[0][0] for col, _ in parsed[1:])
    stack: list[tuple[int, str]] = []
    entries: list[tuple[str, bool]] = []
    for index, (column, name) in enumerate(parsed):
        while stack and stack[-1][0] >= column:
            stack.pop()
        is_dir = name.endswith("/")
        clean = name.rstrip("/")
        if index == 0 and strip_root:
            stack.append((column, ""))
            continue
        parent = stack[-1][1] if stack else ""
        path = f"{parent}/{clean}" if parent else clean
        entries.append((path, is_dir))
        if is_dir:
            stack.append((column, path))
    return entries


def _tree_entries(data: JsonValue) -> tuple[str, list[tuple[str, FileInfo]], bool] | None:
    """Read a tree result as ``(root, [(path, FileInfo)], complete)``; None if not a tree."""
    if not isinstance(data, dict):
        return None
    entries = data.get("entries")
    if isinstance(entries, list):
        root = data.get("root")
        found: list[tuple[str, FileInfo]] = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                continue
            kind = entry.get("kind")
            size = entry.get("size")
            info = FileInfo(
                kind="directory" if kind == "directory" else "file",
                size=size if isinstance(size, int) else None,
                summary="symbolic link" if kind == "symlink" else None,
            )
            found.append((str(entry["path"]), info))
        return (
            root if isinstance(root, str) else ".",
            found,
            data.get("complete") is True,
        )
    tree = data.get("tree")
    lines: list[str] | None = None
    if isinstance(tree, str):
        lines = tree.splitlines()
    elif isinstance(tree, list) and all(isinstance(line, str) for line in tree):
        lines = [line for line in tree if isinstance(line, str)]
    if lines is not None:
        parsed = [
            (path, FileInfo(kind="directory" if is_dir else "file"))
            for path, is_dir in parse_text_tree(lines)
        ]
        return ".", parsed, False
    return None


def directory_tree_handler(environment: Environment, call: ToolCall, result: ToolResult) -> None:
    """Fill ``/workspace/files`` from a directory-tree result (see the module docstring).

    Results that are not trees are left alone.
    """
    parsed = _tree_entries(result.data)
    if parsed is None:
        return
    root, entries, complete = parsed
    files = {
        path: info.model_dump(mode="json") for path, info in environment.workspace.files.items()
    }
    updated: dict[str, JsonValue] = dict(files)
    if complete:
        for path in list(updated):
            if root == "." or path.startswith(f"{root}/"):
                del updated[path]
    for path, info in entries:
        known = files.get(path)
        fresh = info.model_dump(mode="json")
        if isinstance(known, dict) and known.get("summary") and fresh["summary"] is None:
            fresh["summary"] = known["summary"]  # keep what the agent learned about the file
        updated[path] = fresh
    if updated != files:
        environment.set("/workspace/files", updated)


# --- search results -----------------------------------------------------------------------

_URL_KEYS = ("url", "link", "href", "source", "uri")
_TITLE_KEYS = ("title", "name")
_TEXT_KEYS = ("snippet", "summary", "description", "content", "text", "fact")


def _first_str(item: Mapping[str, JsonValue], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = item.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _search_items(data: JsonValue) -> Iterator[Mapping[str, JsonValue]]:
    """The result items of a search result; a plain string item is a snippet."""
    if isinstance(data, list):
        items: list[JsonValue] = data
    elif isinstance(data, dict):
        found = next(
            (data[key] for key in ("results", "items", "hits", "matches") if key in data), None
        )
        items = found if isinstance(found, list) else []
    else:
        items = []
    for item in items:
        if isinstance(item, dict):
            yield item
        elif isinstance(item, str):
            yield {"snippet": item}


def search_results_handler(
    environment: Environment,
    call: ToolCall,
    result: ToolResult,
    *,
    max_facts: int = 200,
    max_fact_chars: int = 500,
) -> None:
    """Add search results to ``/knowledge/discovered_facts`` and ``/knowledge/sources``.

    Each result (an object with a title or snippet, or a plain string) gives a fact (the
    snippet, or the title); one with a URL or source also gives a source (title → URL).
    Facts are deduplicated; only the newest `max_facts` are kept. Results of another shape
    are left alone.
    """
    knowledge = environment.knowledge
    facts = list(knowledge.discovered_facts)
    sources = dict(knowledge.sources)
    for item in _search_items(result.data):
        url = _first_str(item, _URL_KEYS)
        title = _first_str(item, _TITLE_KEYS)
        text = _first_str(item, _TEXT_KEYS)
        fact = text or title
        if fact is None:
            continue
        if len(fact) > max_fact_chars:
            fact = fact[: max_fact_chars - 1] + "…"
        if title and text and not text.startswith(title):
            fact = f"{title}: {fact}"
        if fact not in facts:
            facts.append(fact)
        if url:
            sources[title or url] = url
    facts = facts[-max_facts:] if max_facts > 0 else []
    changes: dict[str, object] = {}
    if facts != knowledge.discovered_facts:
        changes["discovered_facts"] = facts
    if sources != knowledge.sources:
        changes["sources"] = sources
    if changes:
        environment.update_section("knowledge", **changes)
