"""What a ``run_command`` command runs with: its environment, and its confinement if any.

Environment. A command never inherits the agent's environment wholesale (it holds the model's
API key, and whatever else the user exported). It gets the variables `ShellSettings.inherit_env`
names (globs; by default `DEFAULT_COMMAND_ENV`: ``PATH``, ``HOME``, the locale and the
terminal), then `ShellSettings.env` on top. A variable whose name looks secret (`looks_secret`)
is passed only when named exactly, never through a glob.

Confinement. Where bubblewrap (``bwrap``) is installed and works, a command runs inside it
(``sandbox="auto"``, the default, or ``"bwrap"``, which refuses to run unconfined). What it
protects:

- writes: the whole filesystem is read-only to the command, except the workspace
  (read-write) and ``/tmp``;
- ``/tmp`` is a fresh, empty tmpfs of the command's own: it cannot read what the host's
  ``/tmp`` holds (other programs' files, their sockets), and what it writes there is gone
  when it ends. The only host paths under ``/tmp`` it sees are the ones it runs from: the
  workspace (read-write) and the agent's interpreter and virtual environment
  (``sys.executable``, ``sys.prefix``, ``sys.base_prefix`` and their exec and resolved
  forms; read-only), with the bare directories leading to them;
- the `ShellSettings.hidden` paths (in the home directory: ``.ssh``, ``.aws``, ``.gnupg``,
  ``.netrc``, cloud and package-registry credentials, ...) look empty;
- it has its own process, IPC and host-name namespaces: it cannot see or signal the agent's
  processes, nor read their environment through ``/proc``; ``/dev`` holds only the basic
  devices, and ``/dev/shm`` is its own.

What it does not protect:

- reading: everything else the user can read stays readable (``/etc``, ``/var/tmp``, other
  projects, the home directory apart from the hidden paths), so a command can print it and
  the model sees it;
- Unix sockets outside ``/tmp``: connecting to a socket needs no write access, so a socket
  the user may use (``/run/docker.sock``, a session bus under ``/run/user``) still answers,
  and whatever it controls is reachable through it;
- the network, unless ``network=False``; while it is shared, so are the host's abstract Unix
  sockets (an X server's, some session buses);
- the workspace itself: the command can change or delete anything in it, including files
  that run later outside the sandbox (``.git/hooks``, a ``Makefile``);
- resources: nothing limits the CPU, memory or disk (in the workspace or the ``/tmp``
  tmpfs) a command uses; only its time and the output kept are bounded;
- a workspace that is ``/tmp`` itself (or contains it) exposes the host's ``/tmp``.

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
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping
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

#: The temporary directory a confined command gets a private, empty one of.
TMP = "/tmp"


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
    runtime: Iterable[str] | None = None,
) -> list[str]:
    """The bubblewrap command line that runs `command` confined to the workspace `root`.

    Args:
        bwrap: The bubblewrap executable.
        command: The command line, run by ``/bin/sh``.
        root: The workspace (writable).
        cwd: The working directory, inside `root`.
        settings: The confinement settings (network, hidden paths).
        home: The home directory ``~`` stands for in `settings.hidden`.
        runtime: Paths the command must find even under ``/tmp`` (read-only); by default
            the agent's own interpreter and environments (`runtime_paths`).
    """
    argv = [bwrap, *_isolation(settings.network)]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", TMP]
    # The private /tmp hides the host's; only what the command runs from comes back into it.
    # A fixed handful of binds whatever the host's /tmp holds: each costs a mount.
    kept = tmp_binds(runtime_paths() if runtime is None else runtime)
    for path in kept:
        argv += ["--ro-bind-try", path, path]
    # After those, so a virtualenv inside the workspace stays writable.
    workspace = str(root)
    argv += ["--bind", workspace, workspace]
    visible = [workspace, *kept]
    # After the workspace, so a credential directory inside it is hidden too. Plain string
    # and lstat work: this runs before every command.
    for hidden in settings.hidden:
        target = _expand(hidden, home)
        if target is None or _under(workspace, target, or_equal=True):
            continue  # never hide the workspace
        if _under(target, TMP) and not any(_under(target, v, or_equal=True) for v in visible):
            continue  # the private /tmp does not hold it anyway
        try:
            mode = os.lstat(target).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            argv += ["--tmpfs", target]
        elif stat.S_ISREG(mode):
            argv += ["--ro-bind", "/dev/null", target]
    argv += ["--chdir", str(cwd), "--", "/bin/sh", "-c", command]
    return argv


def runtime_paths() -> tuple[str, ...]:
    """The agent's interpreter and the environments it runs from, as named and resolved.

    A command that runs ``sys.executable`` (or the virtualenv's tools on ``PATH``) needs them;
    a symlinked virtualenv needs both its own path and its target.
    """
    return _with_resolved(
        (sys.executable, sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    )


@functools.cache
def _with_resolved(named: tuple[str, ...]) -> tuple[str, ...]:
    # Cached: resolving takes a few system calls per component, before every command.
    found = {path for path in named if path}
    return tuple(sorted(found | {os.path.realpath(path) for path in found}))


def tmp_binds(paths: Iterable[str], *, tmp: str = TMP) -> list[str]:
    """The absolute `paths` strictly inside `tmp`, less those inside another one, sorted."""
    inside = {os.path.normpath(path) for path in paths if os.path.isabs(path) and _under(path, tmp)}
    return sorted(path for path in inside if not any(_under(path, other) for other in inside))


def _under(path: str, parent: str, *, or_equal: bool = False) -> bool:
    """Whether `path` lies strictly inside `parent` (or is it, with `or_equal`), lexically."""
    path, parent = os.path.normpath(path), os.path.normpath(parent)
    if path == parent:
        return or_equal
    return path.startswith(parent.rstrip("/") + "/")


def _expand(path: str, home: str | None) -> str | None:
    if path == "~" or path.startswith("~/"):
        if not home:
            return None
        path = home + path[1:]
    return os.path.normpath(path) if os.path.isabs(path) else None


def describe_boundary(confinement: Confinement, settings: ShellSettings) -> str:
    """What a command can reach, in a few sentences, for the user (`shell_boundary`)."""
    if confinement == "bwrap":
        network = "with" if settings.network else "without"
        return (
            "Commands run confined by bubblewrap: only the workspace and a private, empty /tmp "
            "are writable, the host's /tmp is out of sight, credential files are hidden, the "
            f"agent's processes are out of reach, {network} network access; the rest of the "
            "filesystem stays readable."
        )
    return (
        "Commands are NOT confined (bubblewrap is not used): they run with the user's own "
        "rights and can read or change files outside the workspace; only their working "
        "directory, environment, time and output are limited."
    )
