"""`Workspace`: a root directory that file and shell tools cannot leave.

Every path a model sends is resolved relative to the root, refusing anything that could
leave it: absolute paths (POSIX, Windows drives, UNC), ``..`` components (with either slash),
``~``, NUL bytes, and symlinks — including symlinked parent directories and dangling links —
whose target lies outside the root. Files are then opened one component at a time with
``O_NOFOLLOW`` from the root, so a symlink swapped in between the check and the open fails
instead of being followed. Directories are listed the same way: opened component by
component with ``O_NOFOLLOW | O_DIRECTORY`` and read through their descriptor
(``os.scandir(fd)``), never by name, so a directory swapped for a symlink during a listing is
refused or skipped, never listed. Directory walks never follow symlinks.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Literal

from agent_flow.errors import ToolError, UserError

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
        try:
            resolved = Path(os.path.realpath(self.root.joinpath(*parts)))
        except OSError as err:  # a link removed between realpath's lstat and its readlink
            raise UnsafePathError(
                f"path {path!r} changed while it was being checked; it was not followed"
            ) from err
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
        """Resolve `path` and check it is an existing directory, without following links.

        Raises:
            UnsafePathError: The path is unsafe, or a symlink appeared under it meanwhile.
            ToolError: It does not exist or is not a directory.
        """
        resolved = self.resolve(path)
        os.close(self._open_directory(resolved))
        return resolved

    def _open_directory(self, resolved: Path) -> int:
        """Open the directory `resolved` from the root without following symlinks.

        Opens one component at a time with ``O_NOFOLLOW``; returns the descriptor (the caller
        closes it). A component swapped for a symlink after `resolve` checked it fails here
        instead of leading outside.
        """
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        parts = resolved.relative_to(self.root).parts
        try:
            for index, part in enumerate(parts):
                try:
                    next_fd = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                except OSError as err:
                    raise self._directory_error(err, fd, part, Path(*parts[: index + 1])) from err
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _directory_error(self, err: OSError, parent_fd: int, name: str, at: Path) -> ToolError:
        shown = at.as_posix()
        try:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            return UnsafePathError(
                f"path {shown!r} is or passes through a symbolic link that changed after it "
                "was checked; it was not followed"
            )
        if mode is not None and not stat.S_ISDIR(mode):
            return ToolError(f"{shown!r} is a file, not a directory; use read_file")
        if isinstance(err, FileNotFoundError):
            return ToolError(f"directory {shown!r} does not exist")
        return self._translate(err, self.root / at)

    def iter_entries(self, directory: Path, *, max_depth: int) -> Iterator[WorkspaceEntry]:
        """Walk `directory` breadth-first without following symlinks, skipping excluded names.

        Every directory is opened one component at a time from the root with ``O_NOFOLLOW``
        and read through its descriptor, so a directory swapped for a symlink during the walk
        is skipped (or, for `directory` itself, refused) instead of listed. Yields entries
        with depth 1 for direct children.

        Raises:
            UnsafePathError: `directory` became a symlink after it was checked.
            ToolError: `directory` is not a directory (any more).
        """
        queue: list[tuple[Path, int]] = [(directory, 1)]
        first = True
        while queue:
            current, depth = queue.pop(0)
            try:
                fd = self._open_directory(current)
            except ToolError:
                if first:
                    raise
                continue  # swapped or removed during the walk: not followed, not listed
            first = False
            try:
                entries = self._scan(fd, current, depth)
            finally:
                os.close(fd)
            for entry in entries:
                yield entry
                if entry.kind == "directory" and depth < max_depth:
                    queue.append((self.root / entry.path, depth + 1))

    def _scan(self, fd: int, current: Path, depth: int) -> list[WorkspaceEntry]:
        base = current.relative_to(self.root)
        found: list[WorkspaceEntry] = []
        try:
            with os.scandir(fd) as scan:
                for item in scan:
                    if item.name in self.exclude:
                        continue
                    relative = (base / item.name).as_posix()
                    kind = _entry_kind(item)
                    target = self._link_target(relative) if kind == "symlink" else None
                    found.append(
                        WorkspaceEntry(relative, item.name, kind, _entry_size(item), depth, target)
                    )
        except OSError:
            return found
        found.sort(key=lambda e: (e.kind != "directory", e.name))
        return found

    def _link_target(self, relative: str) -> str:
        """Where a symlink points, relative to the root, or that it leads outside."""
        target = Path(os.path.realpath(self.root / relative))
        return self.relative(target) if self.contains(target) else "(outside the workspace)"

    def has_children(self, entry: WorkspaceEntry) -> bool:
        """Whether the directory `entry` holds anything not excluded (False if unreadable)."""
        try:
            fd = self._open_directory(self.root / entry.path)
        except ToolError:
            return False
        try:
            with os.scandir(fd) as scan:
                return any(child.name not in self.exclude for child in scan)
        except OSError:
            return False
        finally:
            os.close(fd)


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

EntryKind = Literal["file", "directory", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class WorkspaceEntry:
    """One entry met by `Workspace.iter_entries`.

    Attributes:
        path: Its POSIX path relative to the root.
        name: Its name.
        kind: ``file``, ``directory``, ``symlink`` (never followed) or ``other``.
        size: Its size in bytes, for regular files.
        depth: 1 for a direct child of the listed directory.
        link_target: For a symlink: its target relative to the root, or
            ``"(outside the workspace)"``.
    """

    path: str
    name: str
    kind: EntryKind
    size: int | None
    depth: int
    link_target: str | None = None


def _entry_kind(entry: os.DirEntry[str]) -> EntryKind:
    try:
        if entry.is_symlink():
            return "symlink"
        if entry.is_dir(follow_symlinks=False):
            return "directory"
        return "file" if entry.is_file(follow_symlinks=False) else "other"
    except OSError:
        return "other"


def _entry_size(entry: os.DirEntry[str]) -> int | None:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
