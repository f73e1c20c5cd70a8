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

The shell's boundary. A command gets a minimal environment (`ShellSettings.inherit_env`), never
the agent's secrets. Where bubblewrap works it runs confined: the filesystem read-only except
the workspace and a private ``/tmp``, credential files hidden, its own process namespace.
Without bubblewrap it runs with the user's own rights and can reach anything the user can;
the path checks above bind the file tools, not what a command does. See `_sandbox`.

The parts live in private modules: `Workspace` in `_safe_fs`, the file tools in
`_file_tools`, ``run_command`` in `_shell_tool`, its environment and confinement in
`_sandbox`.
"""

from __future__ import annotations

from agent_flow.tools._file_tools import file_tools
from agent_flow.tools._safe_fs import DEFAULT_EXCLUDES, UnsafePathError, Workspace
from agent_flow.tools._sandbox import (
    DEFAULT_COMMAND_ENV,
    DEFAULT_HIDDEN_PATHS,
    SandboxMode,
    ShellSettings,
    describe_boundary,
    resolve_confinement,
)
from agent_flow.tools._shell_tool import run_command_tool
from agent_flow.tools.base import Tool

__all__ = [
    "DEFAULT_COMMAND_ENV",
    "DEFAULT_EXCLUDES",
    "DEFAULT_HIDDEN_PATHS",
    "SandboxMode",
    "ShellSettings",
    "UnsafePathError",
    "Workspace",
    "shell_boundary",
    "workspace_tools",
]


def shell_boundary(shell: ShellSettings | None = None) -> str:
    """One sentence on what ``run_command`` commands can reach under `shell`, here.

    Raises:
        UserError: ``shell.sandbox`` is ``"bwrap"`` and bubblewrap does not work here.
    """
    settings = shell if shell is not None else ShellSettings()
    return describe_boundary(resolve_confinement(settings)[0], settings)


def workspace_tools(
    workspace: Workspace,
    *,
    command_timeout: float = 120.0,
    max_command_output_bytes: int = 100_000,
    max_search_file_bytes: int = 2_000_000,
    shell: ShellSettings | None = None,
) -> list[Tool]:
    """Build the built-in file and shell tools over `workspace`.

    Args:
        workspace: Where the tools work.
        command_timeout: The longest a ``run_command`` call may run (the model may ask for
            less).
        max_command_output_bytes: Output kept from a command (head and tail).
        max_search_file_bytes: Files larger than this are skipped by ``search_text``.
        shell: The environment and confinement of ``run_command``'s commands (default:
            `ShellSettings()`: a minimal environment, confined by bubblewrap when it works).

    Returns:
        ``read_file``, ``write_file``, ``list_directory``, ``directory_tree``,
        ``search_text`` and ``run_command``.

    Raises:
        UserError: ``shell.sandbox`` is ``"bwrap"`` and bubblewrap does not work here.
    """
    return [
        *file_tools(workspace, max_search_file_bytes=max_search_file_bytes),
        run_command_tool(
            workspace,
            command_timeout=command_timeout,
            max_command_output_bytes=max_command_output_bytes,
            shell=shell,
        ),
    ]
