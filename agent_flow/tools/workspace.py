"""A safe workspace and the built-in file and shell tools that work inside it.

`Workspace(root)` resolves every path a model sends relative to one root directory and
refuses anything that could leave it: absolute paths (POSIX, Windows drives, UNC), ``..``
components (with either slash), ``~``, NUL bytes, and symlinks — including symlinked parent
directories and dangling links — whose target lies outside the root. Files are then opened
one component at a time with ``O_NOFOLLOW`` from the root, so a symlink swapped in between the
check and the open fails instead of being followed.

`workspace_tools(workspace)` builds the built-in tools over it:

- ``read_file`` — a file or a line range, bounded in size; refuses binary files;
- ``write_file`` — overwrite, create (fails if the file exists) or append; needs approval;
- ``list_directory`` — one directory;
- ``directory_tree`` — a bounded recursive listing whose result feeds the workspace handler;
- ``search_text`` — a regular expression over text files, with a result limit;
- ``run_command`` — a shell command with a timeout, an output limit and a working directory
  inside the workspace; needs approval; its whole process group is killed on timeout or
  cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fnmatch
import os
import re
import signal
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, BinaryIO, Literal

from pydantic import Field

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import ToolError, UserError
from agent_flow.tools.base import Tool, tool
from agent_flow.tools.policy import RiskLevel, ToolPolicy
from agent_flow.tools.results import ToolResult

__all__ = [
    "DEFAULT_EXCLUDES",
    "UnsafePathError",
    "Workspace",
    "workspace_tools",
]

#: Directory names the tree and search tools skip.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    "node_modules",
    ".venv",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
)

_SYMLINK_OPEN_ERRORS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


class UnsafePathError(ToolError):
    """A path is not a plain relative path inside the workspace (reported to the model)."""


class Workspace:
    """A root directory that file and shell tools cannot leave.

    Args:
        root: The workspace directory (must exist).
        exclude: Directory names skipped by the tree and search tools.
        max_read_bytes: The most bytes ``read_file`` returns in one call.
        max_write_bytes: The largest content ``write_file`` accepts.

    Raises:
        UserError: `root` is not an existing directory.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        exclude: Iterable[str] = DEFAULT_EXCLUDES,
        max_read_bytes: int = 256_000,
        max_write_bytes: int = 2_000_000,
    ) -> None:
        path = Path(root)
        if not path.is_dir():
            raise UserError(f"workspace root {str(root)!r} is not a directory; create it first")
        self.root = path.resolve(strict=True)
        self.exclude = frozenset(exclude)
        self.max_read_bytes = max_read_bytes
        self.max_write_bytes = max_write_bytes

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    # --- resolution -----------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """Return the real absolute path of `path`, which must stay inside the root.

        Existing symlinks are followed and their targets checked; the path itself need not
        exist.

        Raises:
            UnsafePathError: The path is absolute, contains ``..``, ``~`` or a NUL byte, or
                resolves outside the root.
        """
        if "\x00" in path:
            raise UnsafePathError(f"path {path!r} contains a NUL byte; send a plain file path")
        if path in ("", "."):
            return self.root
        if path.startswith("~"):
            raise UnsafePathError(
                f"path {path!r} starts with '~'; use a path relative to the workspace root"
            )
        windows = PureWindowsPath(path)
        if PurePosixPath(path).is_absolute() or windows.drive or windows.root:
            raise UnsafePathError(
                f"path {path!r} is absolute; use a path relative to the workspace root"
            )
        parts = [part for part in re.split(r"[\\/]", path) if part not in ("", ".")]
        if ".." in parts:
            raise UnsafePathError(
                f"path {path!r} contains '..'; paths must stay inside the workspace root"
            )
        if not parts:
            return self.root
        resolved = Path(os.path.realpath(self.root.joinpath(*parts)))
        if not self.contains(resolved):
            raise UnsafePathError(
                f"path {path!r} leads outside the workspace through a symbolic link; "
                "use a path inside the workspace"
            )
        return resolved

    def contains(self, path: Path) -> bool:
        """Whether the absolute `path` is the root or lies under it (no resolution done)."""
        return path == self.root or self.root in path.parents

    def relative(self, path: Path) -> str:
        """The POSIX path of the absolute `path` relative to the root (``"."`` for the root)."""
        relative = path.relative_to(self.root).as_posix()
        return relative or "."

    # --- opening without following symlinks ----------------------------------------------

    def _walk_to_parent(self, resolved: Path, *, create: bool) -> tuple[int, str]:
        """Open the parent directory of `resolved` component by component, never following links.

        Returns an open directory descriptor (the caller closes it) and the final name.
        """
        parts = resolved.relative_to(self.root).parts
        if not parts:
            raise UnsafePathError("the workspace root itself is a directory, not a file")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                try:
                    next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = next_fd
        except OSError as err:
            os.close(fd)
            raise self._translate(err, resolved) from err
        return fd, parts[-1]

    def open_file(self, path: str, flags: int, *, create_parents: bool = False) -> int:
        """Resolve `path` and open it with `flags` plus ``O_NOFOLLOW``; return the descriptor.

        Raises:
            UnsafePathError: The path is unsafe or a symlink appeared under it meanwhile.
            ToolError: The file cannot be opened (missing, a directory, no permission).
        """
        resolved = self.resolve(path)
        parent_fd, name = self._walk_to_parent(resolved, create=create_parents)
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent_fd)
        except OSError as err:
            raise self._translate(err, resolved) from err
        finally:
            os.close(parent_fd)

    def open_regular(self, path: str, flags: int, *, create_parents: bool = False) -> int:
        """Like `open_file`, but refuse anything that is not a regular file.

        Directories, FIFOs and devices are refused without ever blocking on one.
        """
        fd = self.open_file(path, flags | os.O_NONBLOCK, create_parents=create_parents)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            if stat.S_ISDIR(mode):
                raise ToolError(f"{path!r} is a directory; use list_directory to see inside")
            raise ToolError(f"{path!r} is not a regular file")
        os.set_blocking(fd, True)
        return fd

    def _translate(self, err: OSError, resolved: Path) -> ToolError:
        shown = self.relative(resolved) if self.contains(resolved) else str(resolved)
        if err.errno in _SYMLINK_OPEN_ERRORS:
            return UnsafePathError(
                f"path {shown!r} is or passes through a symbolic link that changed after it "
                "was checked; it was not followed"
            )
        if isinstance(err, FileNotFoundError):
            return ToolError(f"{shown!r} does not exist; check the path with list_directory")
        if isinstance(err, IsADirectoryError):
            return ToolError(f"{shown!r} is a directory; use list_directory to see inside")
        if isinstance(err, FileExistsError):
            return ToolError(f"{shown!r} already exists; use mode 'overwrite' to replace it")
        if isinstance(err, PermissionError):
            return ToolError(f"permission denied for {shown!r}")
        return ToolError(f"cannot open {shown!r}: {err.strerror or err}")

    def directory(self, path: str) -> Path:
        """Resolve `path` and check it is an existing directory.

        Raises:
            UnsafePathError: The path is unsafe.
            ToolError: It does not exist or is not a directory.
        """
        resolved = self.resolve(path)
        if not resolved.is_dir():
            shown = self.relative(resolved)
            if resolved.exists():
                raise ToolError(f"{shown!r} is a file, not a directory; use read_file")
            raise ToolError(f"directory {shown!r} does not exist")
        return resolved

    def iter_entries(
        self, directory: Path, *, max_depth: int
    ) -> Iterator[tuple[str, os.DirEntry[str], int]]:
        """Walk `directory` breadth-first without following symlinks, skipping excluded names.

        Yields ``(relative path, entry, depth)`` with depth 1 for direct children.
        """
        queue: list[tuple[Path, int]] = [(directory, 1)]
        while queue:
            current, depth = queue.pop(0)
            try:
                with os.scandir(current) as scan:
                    entries = sorted(scan, key=lambda e: (not _is_dir(e), e.name))
            except OSError:
                continue
            for entry in entries:
                if entry.name in self.exclude:
                    continue
                relative = self.relative(Path(entry.path))
                yield relative, entry, depth
                if _is_dir(entry) and depth < max_depth:
                    queue.append((Path(entry.path), depth + 1))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _entry_kind(entry: os.DirEntry[str]) -> Literal["file", "directory", "symlink", "other"]:
    if entry.is_symlink():
        return "symlink"
    if _is_dir(entry):
        return "directory"
    try:
        return "file" if entry.is_file(follow_symlinks=False) else "other"
    except OSError:
        return "other"


def _entry_size(entry: os.DirEntry[str]) -> int | None:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _looks_binary(chunk: bytes) -> bool:
    return b"\x00" in chunk[:8192]


# --- the tools ----------------------------------------------------------------------------

_READ_ONLY = ToolPolicy(read_only=True)
_WRITE = ToolPolicy(requires_approval=True, risk=RiskLevel.MEDIUM)
_COMMAND = ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH, command_argument="command")


def workspace_tools(
    workspace: Workspace,
    *,
    command_timeout: float = 120.0,
    max_command_output_bytes: int = 100_000,
    max_search_file_bytes: int = 2_000_000,
) -> list[Tool]:
    """Build the built-in file and shell tools over `workspace`.

    Args:
        workspace: Where the tools work.
        command_timeout: The longest a ``run_command`` call may run (the model may ask for
            less).
        max_command_output_bytes: Output kept from a command (head and tail).
        max_search_file_bytes: Files larger than this are skipped by ``search_text``.

    Returns:
        ``read_file``, ``write_file``, ``list_directory``, ``directory_tree``,
        ``search_text`` and ``run_command``.
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
        directory = workspace.directory(path)
        entries: list[JsonValue] = []
        lines: list[str] = []
        for relative, entry, _ in workspace.iter_entries(directory, max_depth=1):
            kind = _entry_kind(entry)
            size = _entry_size(entry)
            item: JsonObject = {"path": relative, "name": entry.name, "kind": kind, "size": size}
            if kind == "symlink":
                item["target"] = _describe_link(workspace, Path(entry.path))
                lines.append(f"{entry.name} -> {item['target']}")
            elif kind == "directory":
                lines.append(f"{entry.name}/")
            else:
                lines.append(f"{entry.name} ({size} bytes)")
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
        directory = workspace.directory(path)
        root = workspace.relative(directory)
        entries: list[JsonValue] = []
        complete = True
        by_parent: dict[str, list[tuple[str, str]]] = {}
        for relative, entry, depth in workspace.iter_entries(directory, max_depth=max_depth):
            if len(entries) >= max_entries:
                complete = False
                break
            kind = _entry_kind(entry)
            if kind == "directory" and depth == max_depth and _has_children(entry, workspace):
                complete = False
            entries.append({"path": relative, "kind": kind, "size": _entry_size(entry)})
            parent = relative.rpartition("/")[0] or "."
            by_parent.setdefault(parent, []).append((entry.name, kind))
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
                (relative, Path(entry.path))
                for relative, entry, _ in workspace.iter_entries(start, max_depth=64)
                if _entry_kind(entry) == "file"
            ]
        elif start.is_file():
            files = [(workspace.relative(start), start)]
        else:
            raise ToolError(f"{path!r} does not exist")
        matches: list[JsonValue] = []
        lines: list[str] = []
        searched = 0
        truncated = False
        for relative, file_path in files:
            if glob and not (
                fnmatch.fnmatch(relative, glob) or fnmatch.fnmatch(file_path.name, glob)
            ):
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

    @tool(policy=_COMMAND, timeout=command_timeout + 10.0)
    async def run_command(
        command: str,
        cwd: str = ".",
        timeout_seconds: Annotated[float | None, Field(gt=0)] = None,
    ) -> ToolResult:
        """Run a shell command in the workspace and return its exit code and output.

        Args:
            command: The command line, run by /bin/sh.
            cwd: The working directory, relative to the workspace root.
            timeout_seconds: Stop the command after this many seconds.
        """
        directory = workspace.directory(cwd)
        limit = min(timeout_seconds or command_timeout, command_timeout)
        return await _run_shell(
            command,
            cwd=directory,
            shown_cwd=workspace.relative(directory),
            limit_seconds=limit,
            max_output_bytes=max_command_output_bytes,
        )

    return [read_file, write_file, list_directory, directory_tree, search_text, run_command]


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


def _describe_link(workspace: Workspace, link: Path) -> str:
    target = Path(os.path.realpath(link))
    if workspace.contains(target):
        return workspace.relative(target)
    return "(outside the workspace)"


def _has_children(entry: os.DirEntry[str], workspace: Workspace) -> bool:
    try:
        with os.scandir(entry.path) as scan:
            return any(child.name not in workspace.exclude for child in scan)
    except OSError:
        return False


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


# --- shell commands -----------------------------------------------------------------------


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _OutputBuffer:
    """Keeps the head and the tail of a stream within a byte limit."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit * 3 // 4
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def omitted(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if not self.omitted:
            return head + self.tail.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        return f"{head}\n[... {self.omitted} bytes of output omitted ...]\n{tail}"


async def _run_shell(
    command: str, *, cwd: Path, shown_cwd: str, limit_seconds: float, max_output_bytes: int
) -> ToolResult:
    started = time.monotonic()
    spawn = asyncio.create_task(
        asyncio.create_subprocess_shell(
            command,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so the whole tree can be killed
        )
    )
    try:
        process = await asyncio.shield(spawn)
    except asyncio.CancelledError:
        # Cancelled while the process was being started: it may run already; stop it.
        with contextlib.suppress(Exception):
            orphan = await spawn
            _kill_group(orphan.pid)
            await orphan.wait()
        raise
    output = _OutputBuffer(max_output_bytes)

    async def read_output() -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            output.add(chunk)

    reader = asyncio.create_task(read_output())
    timed_out = False
    try:
        async with asyncio.timeout(limit_seconds):
            # process.wait() also waits for the pipe to close, which a background child
            # keeps open: watch the exit itself (returncode) while the output streams in.
            while not reader.done() and process.returncode is None:
                await asyncio.wait({reader}, timeout=0.05)
            if process.returncode is not None:
                # The command is over; background children it left behind go with it.
                _kill_group(process.pid)
            await reader
            await process.wait()
    except TimeoutError:
        timed_out = True
    finally:
        _kill_group(process.pid)
        if process.returncode is None:
            await process.wait()
        if not reader.done():
            # The group is dead: the pipe reaches EOF soon; do not wait on stragglers forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(reader)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    elapsed = time.monotonic() - started
    text = output.text()
    data: JsonObject = {
        "command": command,
        "cwd": shown_cwd,
        "exit_code": process.returncode,
        "timed_out": timed_out,
        "output": text,
        "output_bytes": output.total,
        "output_truncated": output.omitted > 0,
        "duration_seconds": round(elapsed, 3),
    }
    if timed_out:
        return ToolResult(
            content=(
                f"command timed out after {limit_seconds:g}s and was killed; output so far:\n{text}"
            ),
            data=data,
            is_error=True,
            error_kind="timeout",
        )
    body = text if text else "(no output)"
    return ToolResult(content=f"exit code {process.returncode}\n{body}", data=data)
