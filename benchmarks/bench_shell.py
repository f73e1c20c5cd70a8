"""What confinement costs a ``run_command`` call, beside the same call unconfined.

Each row runs one short command (``echo ok``) through the real ``run_command`` tool, unconfined
(``sandbox="none"``, the baseline) and confined by bubblewrap (``sandbox="bwrap"``), in
alternation so that both see the same load; the overhead is the median of the paired
differences, against the goal of at most 10 ms whatever the host's ``/tmp`` holds. The rows
differ by what ``/tmp`` holds: what is there already, then that plus ``--entries`` files and
directories the benchmark creates (and removes when it ends, however it ends). The last row
replays the command line from before the private ``/tmp`` kept only what the command runs
from: one read-only bind per entry of the host's ``/tmp``.

Usage: python benchmarks/bench_shell.py [--repeat 30] [--entries 250]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

from agent_flow.tools import (
    ShellSettings,
    Tool,
    ToolContext,
    ToolResult,
    Workspace,
    _sandbox,
    workspace_tools,
)

COMMAND = "echo ok"
GOAL_MS = 10.0


def run_command(root: Path, sandbox: _sandbox.SandboxMode) -> Tool:
    """The ``run_command`` tool over `root`, confined or not."""
    tools = workspace_tools(Workspace(root), shell=ShellSettings(sandbox=sandbox))
    (tool,) = [t for t in tools if t.name == "run_command"]
    return tool


async def call_ms(tool: Tool) -> float:
    """Run `COMMAND` once through `tool`; its wall time in milliseconds."""
    start = time.perf_counter()
    result = await tool.run({"command": COMMAND}, ToolContext(tool_name=tool.name))
    elapsed = (time.perf_counter() - start) * 1000
    assert isinstance(result, ToolResult)
    assert result.content == "exit code 0\nok\n", result.content
    return elapsed


@contextlib.contextmanager
def extra_tmp_entries(count: int) -> Iterator[None]:
    """`count` new entries directly in /tmp (half directories, half files), removed after."""
    made: list[Path] = []
    try:
        for i in range(count):
            path = Path("/tmp") / f"agent-flow-bench-{os.getpid()}-{i}"
            if i % 2:
                path.mkdir()
                (path / "data.txt").write_text("x")
            else:
                path.write_text("x")
            made.append(path)
        yield
    finally:
        for path in made:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _per_entry_binds() -> list[str]:
    """The binds the confinement used to add: one per directory or file in the host's /tmp."""
    binds: list[str] = []
    for entry in os.scandir("/tmp"):
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                binds += ["--ro-bind-try", entry.path, entry.path]
    return binds


def _old_bwrap_argv(real: Callable[..., list[str]]) -> Callable[..., list[str]]:
    def argv(*args: object, **kwargs: object) -> list[str]:
        line = real(*args, **kwargs)
        at = line.index("--tmpfs") + 2  # right after the private /tmp, as it was
        return [*line[:at], *_per_entry_binds(), *line[at:]]

    return argv


async def measure(baseline: Tool, confined: Tool, repeat: int) -> tuple[list[float], list[float]]:
    """Wall times (ms) of `repeat` unconfined and confined calls, in alternation."""
    await call_ms(baseline)  # warm both paths up (imports, bwrap's page cache)
    await call_ms(confined)
    plain, boxed = [], []
    for _ in range(repeat):
        plain.append(await call_ms(baseline))
        boxed.append(await call_ms(confined))
    return plain, boxed


def _row(name: str, entries: int, times: tuple[list[float], list[float]]) -> None:
    plain, boxed = times
    paired = statistics.median(b - p for p, b in zip(plain, boxed, strict=True))
    best = min(boxed) - min(plain)
    verdict = "ok" if best <= GOAL_MS else f"over {GOAL_MS:g} ms"
    print(
        f"{name:<36} {entries:>7} {statistics.median(plain):>6.2f} {min(plain):>6.2f} "
        f"{statistics.median(boxed):>7.2f} {min(boxed):>6.2f} {paired:>7.2f} {best:>6.2f}  "
        f"{verdict}",
        flush=True,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=30, help="paired calls per row")
    parser.add_argument("--entries", type=int, default=250, help="entries added to /tmp")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        raise SystemExit("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    # The workspace lives outside /tmp, so that /tmp holds only what the rows say.
    base = Path(tempfile.mkdtemp(prefix="agent-flow-bench-", dir="/var/tmp"))
    try:
        baseline, confined = run_command(base, "none"), run_command(base, "bwrap")
        print(f"`{COMMAND}` through run_command, {args.repeat} paired calls per row, in ms")
        print(
            f"{'':<36} {'':>7} {'unconfined':>13} {'confined':>14} {'overhead':>14}  "
            f"goal <= {GOAL_MS:g} ms"
        )
        print(
            f"{'/tmp holds':<36} {'entries':>7} {'median':>6} {'best':>6} {'median':>7} "
            f"{'best':>6} {'median':>7} {'best':>6}"
        )
        present = len(os.listdir("/tmp"))
        _row("what it holds already", present, await measure(baseline, confined, args.repeat))
        with extra_tmp_entries(args.entries):
            crowded = len(os.listdir("/tmp"))
            times = await measure(baseline, confined, args.repeat)
            _row(f"... plus {args.entries} entries", crowded, times)
            old = _old_bwrap_argv(_sandbox.bwrap_argv)
            with mock.patch("agent_flow.tools._shell_tool.bwrap_argv", old):
                times = await measure(baseline, confined, max(3, args.repeat // 5))
            _row("... one bind per entry (before)", crowded, times)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
