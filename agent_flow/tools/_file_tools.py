"""The built-in file tools over a `Workspace`.

- ``read_file`` — a file or a line range, bounded in size; refuses binary files;
- ``write_file`` — overwrite, create (fails if the file exists) or append; needs approval;
- ``list_directory`` — one directory;
- ``directory_tree`` — a bounded recursive listing whose result feeds the workspace handler;
- ``search_text`` — a regular expression over text files, with a result limit.
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import TYPE_CHECKING, Annotated, BinaryIO, Literal

from pydantic import Field

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import ToolError
from agent_flow.tools.base import Tool, tool
from agent_flow.tools.policy import RiskLevel, ToolPolicy
from agent_flow.tools.results import ToolResult

if TYPE_CHECKING:
    from agent_flow.tools._safe_fs import Workspace

_READ_ONLY = ToolPolicy(read_only=True)
_WRITE = ToolPolicy(requires_approval=True, risk=RiskLevel.MEDIUM)


def file_tools(workspace: Workspace, *, max_search_file_bytes: int) -> list[Tool]:
    """Build the file tools over `workspace` (see `workspace_tools`).

    Args:
        workspace: Where the tools work.
        max_search_file_bytes: Files larger than this are skipped by ``search_text``.

    Returns:
        ``read_file``, ``write_file``, ``list_directory``, ``directory_tree`` and
        ``search_text``.
    """

    @tool(policy=_READ_ONLY)
    def read_file(
        path: str,
        start_line: Annotated[int, Field(ge=1)] = 1,
        end_line: Annotated[int | None, Field(ge=1)] = None,
    ) -> ToolResult:
        """Read a text file in the workspace, whole or a range of lines.

        Args:
            path: The file, relative to the workspace root.
            start_line: The first line to return (1-based).
            end_line: The last line to return (inclusive); omit to read to the end.
        """
        if end_line is not None and end_line < start_line:
            raise ToolError(f"end_line {end_line} is before start_line {start_line}")
        fd = workspace.open_regular(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as handle:
            head = handle.read(8192)
            if _looks_binary(head):
                raise ToolError(f"{path!r} is a binary file; only text files can be read")
            handle.seek(0)
            return _read_lines(handle, path, start_line, end_line, workspace.max_read_bytes)

    @tool(policy=_WRITE)
    def write_file(
        path: str,
        content: str,
        mode: Literal["overwrite", "create", "append"] = "overwrite",
    ) -> ToolResult:
        """Write a text file in the workspace, creating missing parent directories.

        Args:
            path: The file, relative to the workspace root.
            content: The full text to write.
            mode: 'overwrite' replaces the file, 'create' fails if it exists, 'append' adds
                to its end.
        """
        data = content.encode("utf-8")
        if len(data) > workspace.max_write_bytes:
            raise ToolError(
                f"content is {len(data)} bytes, over the {workspace.max_write_bytes}-byte limit; "
                "write the file in parts with mode 'append'"
            )
        flags = os.O_WRONLY | os.O_CREAT
        flags |= {"overwrite": os.O_TRUNC, "create": os.O_EXCL, "append": os.O_APPEND}[mode]
        existed = workspace.resolve(path).exists()
        fd = workspace.open_regular(path, flags, create_parents=True)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        relative = workspace.relative(workspace.resolve(path))
        verb = "appended" if mode == "append" else ("overwrote" if existed else "created")
        return ToolResult(
            content=f"{verb} {relative} ({len(data)} bytes)",
            data={
                "path": relative,
                "bytes_written": len(data),
                "mode": mode,
                "created": not existed,
            },
        )

    @tool(policy=_READ_ONLY)
    def list_directory(path: str = ".") -> ToolResult:
        """List one directory of the workspace (directories first).

        Args:
            path: The directory, relative to the workspace root.
        """
        directory = workspace.resolve(path)
        entries: list[JsonValue] = []
        lines: list[str] = []
        for entry in workspace.iter_entries(directory, max_depth=1):
            item: JsonObject = {
                "path": entry.path,
                "name": entry.name,
                "kind": entry.kind,
                "size": entry.size,
            }
            if entry.kind == "symlink":
                item["target"] = entry.link_target
                lines.append(f"{entry.name} -> {entry.link_target}")
            elif entry.kind == "directory":
                lines.append(f"{entry.name}/")
            else:
                lines.append(f"{entry.name} ({entry.size} bytes)")
            entries.append(item)
        shown = workspace.relative(directory)
        content = "\n".join(lines) if lines else f"{shown} is empty"
        return ToolResult(content=content, data={"path": shown, "entries": entries})

    @tool(policy=_READ_ONLY)
    def directory_tree(
        path: str = ".",
        max_depth: Annotated[int, Field(ge=1, le=20)] = 3,
        max_entries: Annotated[int, Field(ge=1, le=5000)] = 300,
    ) -> ToolResult:
        """Show the tree of files and directories under a workspace directory.

        Args:
            path: The directory to start from, relative to the workspace root.
            max_depth: How many levels to descend.
            max_entries: The most entries to list.
        """
        directory = workspace.resolve(path)
        root = workspace.relative(directory)
        entries: list[JsonValue] = []
        complete = True
        by_parent: dict[str, list[tuple[str, str]]] = {}
        for entry in workspace.iter_entries(directory, max_depth=max_depth):
            if len(entries) >= max_entries:
                complete = False
                break
            if (
                entry.kind == "directory"
                and entry.depth == max_depth
                and workspace.has_children(entry)
            ):
                complete = False
            entries.append({"path": entry.path, "kind": entry.kind, "size": entry.size})
            parent = entry.path.rpartition("/")[0] or "."
            by_parent.setdefault(parent, []).append((entry.name, entry.kind))
        lines = [f"{root}/" if root != "." else "./"]
        _render_tree(by_parent, root, "", lines)
        if not complete:
            lines.append(
                f"[listing incomplete: limited to depth {max_depth} and {max_entries} entries]"
            )
        return ToolResult(
            content="\n".join(lines),
            data={"root": root, "entries": entries, "complete": complete, "max_depth": max_depth},
        )

    @tool(policy=_READ_ONLY)
    def search_text(
        pattern: str,
        path: str = ".",
        glob: str | None = None,
        ignore_case: bool = False,
        max_results: Annotated[int, Field(ge=1, le=1000)] = 50,
    ) -> ToolResult:
        """Search text files in the workspace for a regular expression.

        Args:
            pattern: A Python regular expression, matched against each line.
            path: A file or directory to search, relative to the workspace root.
            glob: Only search files whose path or name matches this glob (e.g. '*.py').
            ignore_case: Match regardless of case.
            max_results: The most matching lines to return.
        """
        try:
            regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as err:
            raise ToolError(
                f"pattern {pattern!r} is not a valid regular expression: {err}"
            ) from err
        start = workspace.resolve(path)
        if start.is_dir():
            files = [
                (entry.path, entry.name)
                for entry in workspace.iter_entries(start, max_depth=64)
                if entry.kind == "file"
            ]
        elif start.is_file():
            files = [(workspace.relative(start), start.name)]
        else:
            raise ToolError(f"{path!r} does not exist")
        matches: list[JsonValue] = []
        lines: list[str] = []
        searched = 0
        truncated = False
        for relative, name in files:
            if glob and not (fnmatch.fnmatch(relative, glob) or fnmatch.fnmatch(name, glob)):
                continue
            found = _search_file(workspace, relative, regex, max_search_file_bytes)
            if found is None:
                continue
            searched += 1
            for line_number, text in found:
                if len(matches) >= max_results:
                    truncated = True
                    break
                shown = text if len(text) <= 300 else text[:300] + "…"
                matches.append({"path": relative, "line": line_number, "text": shown})
                lines.append(f"{relative}:{line_number}: {shown}")
            if truncated:
                break
        if truncated:
            lines.append(f"[stopped after {max_results} matches; narrow the search]")
        content = "\n".join(lines) if lines else f"no matches for {pattern!r}"
        return ToolResult(
            content=content,
            data={
                "pattern": pattern,
                "matches": matches,
                "files_searched": searched,
                "truncated": truncated,
            },
        )

    return [read_file, write_file, list_directory, directory_tree, search_text]


def _looks_binary(chunk: bytes) -> bool:
    return b"\x00" in chunk[:8192]


def _read_lines(
    handle: BinaryIO, path: str, start_line: int, end_line: int | None, max_bytes: int
) -> ToolResult:
    selected: list[str] = []
    used = 0
    line_number = 0
    last_returned = start_line - 1
    stopped_early = False
    for raw in handle:
        line_number += 1
        if line_number < start_line:
            continue
        if end_line is not None and line_number > end_line:
            line_number -= 1
            break
        if used + len(raw) > max_bytes:
            stopped_early = True
            break
        selected.append(raw.decode("utf-8", errors="replace"))
        used += len(raw)
        last_returned = line_number
    text = "".join(selected)
    if start_line > 1 and not selected and not stopped_early:
        raise ToolError(
            f"{path!r} has only {line_number} lines; start_line {start_line} is past the end"
        )
    content = text
    if stopped_early:
        content += (
            f"\n[output limit of {max_bytes} bytes reached after line {last_returned}; "
            f"read on with start_line={last_returned + 1}]"
        )
    return ToolResult(
        content=content if content else "(empty file)",
        data={
            "path": path,
            "start_line": start_line,
            "end_line": last_returned,
            "truncated": stopped_early,
        },
    )


def _render_tree(
    by_parent: dict[str, list[tuple[str, str]]], parent: str, prefix: str, lines: list[str]
) -> None:
    children = by_parent.get(parent, [])
    for index, (name, kind) in enumerate(children):
        last = index == len(children) - 1
        suffix = "/" if kind == "directory" else (" ->" if kind == "symlink" else "")
        lines.append(f"{prefix}{'└── ' if last else '├── '}{name}{suffix}")
        if kind == "directory":
            child = name if parent == "." else f"{parent}/{name}"
            _render_tree(by_parent, child, prefix + ("    " if last else "│   "), lines)


def _search_file(
    workspace: Workspace, relative: str, regex: re.Pattern[str], max_bytes: int
) -> list[tuple[int, str]] | None:
    """Return the matching lines of one file, or None if it was skipped (binary, large, gone)."""
    try:
        fd = workspace.open_regular(relative, os.O_RDONLY)
    except ToolError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if os.fstat(handle.fileno()).st_size > max_bytes:
            return None
        data = handle.read()
    if _looks_binary(data):
        return None
    text = data.decode("utf-8", errors="replace")
    return [
        (number, line.rstrip("\r"))
        for number, line in enumerate(text.split("\n"), start=1)
        if regex.search(line)
    ]
