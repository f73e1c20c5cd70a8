"""What a ``run_command`` command runs with: its environment, and its confinement if any.

Environment. A command never inherits the agent's environment wholesale (it holds the model's
API key, and whatever else the user exported). It gets the variables `ShellSettings.inherit_env`
names (globs; by default `DEFAULT_COMMAND_ENV`: ``PATH``, ``HOME``, the locale and the
terminal), then `ShellSettings.env` on top. A variable whose name looks secret (`looks_secret`)
is passed only when named exactly, never through a glob.

Confinement. Where bubblewrap (``bwrap``) is installed and works, a command runs inside it
(``sandbox="auto"``, the default, or ``"bwrap"``, which refuses to run unconfined):

- the whole filesystem is read-only, except the workspace (read-write) and a private
  ``/tmp`` (what the host's ``/tmp`` holds stays readable there, read-only; what the command
  writes in it is its own and gone when it ends);
- the `ShellSettings.hidden` paths (in the home directory: ``.ssh``, ``.aws``, ``.gnupg``,
  ``.netrc``, cloud and package-registry credentials, ...) are replaced by empty ones;
- it has its own process, IPC and host-name namespaces: it cannot see or signal the agent's
  processes, nor read their environment through ``/proc``;
- the network stays reachable unless ``network=False``.

Without bubblewrap (``sandbox="auto"`` on a machine without it, or ``sandbox="none"``) a
command runs as the agent's user with that user's rights: it can read and change anything the
user can, inside the workspace or not. Only its working directory, its environment, its time
and its output are bounded then, and the tool's description says so.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from agent_flow.errors import UserError
from agent_flow.tools._secrets import looks_secret

logger = logging.getLogger("agent_flow.tools.workspace")

#: The variables a command inherits by default (globs).
DEFAULT_COMMAND_ENV: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "TZ",
    "TMPDIR",
)

#: Paths hidden from a confined command (``~`` is the home directory).
DEFAULT_HIDDEN_PATHS: tuple[str, ...] = (
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.config/gh",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.git-credentials",
    "~/.npmrc",
    "~/.pypirc",
    "~/.cargo/credentials.toml",
)

#: How commands are confined: ``auto`` uses bubblewrap when it works here and runs
#: unconfined otherwise, ``bwrap`` refuses to run without it, ``none`` never confines.
SandboxMode: TypeAlias = Literal["auto", "bwrap", "none"]


class ShellSettings(BaseModel):
    """How ``run_command`` runs commands (see `agent_flow.tools.workspace_tools`).

    Attributes:
        inherit_env: The agent's environment variables a command gets (globs); a name that
            looks secret must be listed exactly.
        env: Variables set for every command, over the inherited ones.
        sandbox: ``auto`` (bubblewrap when available, else unconfined), ``bwrap`` (always
            confined; a command fails when bubblewrap does not work here) or ``none``.
        network: Whether a confined command can reach the network.
        hidden: Paths a confined command sees empty (``~`` is the home directory).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    inherit_env: tuple[str, ...] = DEFAULT_COMMAND_ENV
    env: dict[str, str] = Field(default_factory=dict)
    sandbox: SandboxMode = "auto"
    network: bool = True
    hidden: tuple[str, ...] = DEFAULT_HIDDEN_PATHS


Confinement: TypeAlias = Literal["bwrap", "none"]


def command_environment(
    settings: ShellSettings, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a command gets: the inherited variables, then `settings.env`."""
    source = os.environ if environ is None else environ
    exact = {pattern for pattern in settings.inherit_env if not _is_glob(pattern)}
    globs = [pattern for pattern in settings.inherit_env if _is_glob(pattern)]
    chosen = {
        name: value
        for name, value in source.items()
        if name in exact
        or (not looks_secret(name) and any(fnmatch.fnmatchcase(name, g) for g in globs))
    }
    chosen.update(settings.env)
    return chosen


def _is_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


@functools.cache
def _bwrap_works(bwrap: str, network: bool) -> str | None:
    """None when `bwrap` can start a confined command here, else why not."""
    argv = [bwrap, *_isolation(network), "--ro-bind", "/", "/", "--", "/bin/sh", "-c", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{bwrap} could not be run: {err}"
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return f"{bwrap} failed here: {detail[-1] if detail else f'exit {done.returncode}'}"
    return None


def _isolation(network: bool) -> list[str]:
    return ["--die-with-parent", "--unshare-all", *(["--share-net"] if network else [])]


def resolve_confinement(settings: ShellSettings) -> tuple[Confinement, str | None]:
    """How commands will run under `settings`, and the bwrap executable if confined.

    Raises:
        UserError: ``sandbox="bwrap"`` and bubblewrap is missing or does not work here.
    """
    if settings.sandbox == "none":
        return "none", None
    bwrap = shutil.which("bwrap")
    problem = (
        "bubblewrap (bwrap) is not installed"
        if bwrap is None
        else _bwrap_works(bwrap, settings.network)
    )
    if problem is None:
        return "bwrap", bwrap
    if settings.sandbox == "bwrap":
        raise UserError(
            f"run_command cannot be confined: {problem}; install bubblewrap "
            "(apt-get install bubblewrap) or set sandbox to 'auto' or 'none'"
        )
    logger.info("run_command runs unconfined: %s", problem)
    return "none", None


def bwrap_argv(
    bwrap: str,
    command: str,
    *,
    root: Path,
    cwd: Path,
    settings: ShellSettings,
    home: str | None,
) -> list[str]:
    """The bubblewrap command line that runs `command` confined to the workspace `root`."""
    argv = [bwrap, *_isolation(settings.network)]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    # What already lives in /tmp (a project's virtualenv, a checkout) stays readable in the
    # private /tmp; what the command writes there stays its own.
    argv += _host_tmp_binds()
    argv += ["--bind", str(root), str(root)]
    # After the workspace, so a credential directory inside it is hidden too.
    for hidden in settings.hidden:
        path = _expand(hidden, home)
        if path is None or root == path or path in root.parents:
            continue  # never hide the workspace
        if path.is_dir() and not path.is_symlink():
            argv += ["--tmpfs", str(path)]
        elif path.is_file() and not path.is_symlink():
            argv += ["--ro-bind", "/dev/null", str(path)]
    argv += ["--chdir", str(cwd), "--", "/bin/sh", "-c", command]
    return argv


def _host_tmp_binds() -> list[str]:
    """Read-only binds of the host's /tmp entries into the private one (no sockets or FIFOs)."""
    binds: list[str] = []
    try:
        entries = list(os.scandir("/tmp"))
    except OSError:
        return binds
    for entry in entries:
        try:
            wanted = entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)
        except OSError:
            continue
        if wanted:
            binds += ["--ro-bind-try", entry.path, entry.path]
    return binds


def _expand(path: str, home: str | None) -> Path | None:
    if path == "~" or path.startswith("~/"):
        if not home:
            return None
        path = home + path[1:]
    candidate = Path(path)
    return candidate if candidate.is_absolute() else None


def describe_boundary(confinement: Confinement, settings: ShellSettings) -> str:
    """What a command can reach, in a few sentences, for the user (`shell_boundary`)."""
    if confinement == "bwrap":
        network = "with" if settings.network else "without"
        return (
            "Commands run confined by bubblewrap: only the workspace and a private /tmp are "
            f"writable, credential files are hidden, the agent's processes are out of reach, "
            f"{network} network access."
        )
    return (
        "Commands are NOT confined (bubblewrap is not used): they run with the user's own "
        "rights and can read or change files outside the workspace; only their working "
        "directory, environment, time and output are limited."
    )
