"""`Workspace`: a root directory that file and shell tools cannot leave.

Every path a model sends is resolved relative to the root, refusing anything that could
leave it: absolute paths (POSIX, Windows drives, UNC), ``..`` components (with either slash),
``~``, NUL bytes, and symlinks — including symlinked parent directories and dangling links —
whose target lies outside the root. Files are then opened one component at a time with
``O_NOFOLLOW`` from the root, so a symlink swapped in between the check and the open fails
instead of being followed. Directory walks never follow symlinks either.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

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
