"""The built-in ``run_command`` tool: a shell command inside a `Workspace`.

The command runs under ``/bin/sh`` in a working directory inside the workspace, with a
timeout and an output limit (the head and the tail are kept), a minimal environment and,
where bubblewrap works, confined to the workspace (`_sandbox`). It runs in a process group of
its own, which is killed on timeout or cancellation and once the command exits, so
background children do not outlive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from agent_flow._types import JsonObject
from agent_flow._utils import cancel_and_wait
from agent_flow.tools._sandbox import (
    Confinement,
    ShellSettings,
    bwrap_argv,
    command_environment,
    resolve_confinement,
)
from agent_flow.tools.base import Tool, tool
from agent_flow.tools.policy import RiskLevel, ToolPolicy
from agent_flow.tools.results import ToolResult

if TYPE_CHECKING:
    from agent_flow.tools._safe_fs import Workspace

_COMMAND = ToolPolicy(requires_approval=True, risk=RiskLevel.HIGH, command_argument="command")


def run_command_tool(
    workspace: Workspace,
    *,
    command_timeout: float,
    max_command_output_bytes: int,
    shell: ShellSettings | None = None,
) -> Tool:
    """Build ``run_command`` over `workspace` (see `workspace_tools`).

    Args:
        workspace: Where commands run.
        command_timeout: The longest a call may run (the model may ask for less).
        max_command_output_bytes: Output kept from a command (head and tail).
        shell: The commands' environment and confinement (default `ShellSettings()`).

    Raises:
        UserError: ``shell.sandbox`` is ``"bwrap"`` and bubblewrap does not work here.
    """
    settings = shell if shell is not None else ShellSettings()
    confinement, bwrap = resolve_confinement(settings)

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
        env = command_environment(settings)
        argv: list[str] | None = None
        if bwrap is not None:
            env["TMPDIR"] = "/tmp"  # the only temporary directory a confined command can write
            argv = bwrap_argv(
                bwrap,
                command,
                root=workspace.root,
                cwd=directory,
                settings=settings,
                home=env.get("HOME") or os.environ.get("HOME"),
            )
        return await _run_shell(
            command,
            argv=argv,
            env=env,
            confinement=confinement,
            cwd=directory,
            shown_cwd=workspace.relative(directory),
            limit_seconds=limit,
            max_output_bytes=max_command_output_bytes,
        )

    return run_command


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
    command: str,
    *,
    argv: list[str] | None,
    env: dict[str, str],
    confinement: Confinement,
    cwd: Path,
    shown_cwd: str,
    limit_seconds: float,
    max_output_bytes: int,
) -> ToolResult:
    started = time.monotonic()
    options: dict[str, object] = {
        "cwd": cwd,
        "env": env,
        "stdin": asyncio.subprocess.DEVNULL,
        "stdout": asyncio.subprocess.PIPE,
        "stderr": asyncio.subprocess.STDOUT,
        "start_new_session": True,  # its own process group, so the whole tree can be killed
    }
    spawn = asyncio.create_task(
        asyncio.create_subprocess_exec(*argv, **options)  # type: ignore[arg-type]
        if argv is not None
        else asyncio.create_subprocess_shell(command, **options)  # type: ignore[arg-type]
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
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await asyncio.shield(reader)
            finally:  # (cancelled meanwhile: the reader still stops)
                await cancel_and_wait(reader)
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
        "confinement": confinement,
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
