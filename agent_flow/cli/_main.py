"""`main`: parse the arguments, run the command, and map what ended it to an exit code.

The codes and their meaning are listed in `agent_flow.cli`; errors are one line on stderr.

Logging goes through one handler that `main` installs for the command's duration (and
removes after): by default agent_flow's own warnings and errors, one line each without
tracebacks, and nothing from other libraries (the MCP SDK logs a traceback for every
non-JSON line a server prints); ``-v`` adds info messages (a server's stderr lines among
them) and other libraries' warnings, ``-vv`` debug messages and tracebacks. ``--log-file``
sends the log, with times and tracebacks, to a file instead of stderr. Python warnings are
routed through the same handler.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

from agent_flow.cli._exit import (
    EXIT_CANCELLED,
    EXIT_MODEL,
    EXIT_RUN_FAILED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    _error_line,
    _Failure,
    _Streams,
)
from agent_flow.cli._parser import build_parser
from agent_flow.errors import (
    AgentFlowError,
    ExportFormatError,
    MCPServerError,
    MCPServerTimeoutError,
    ModelError,
    SessionNotFoundError,
    StoreError,
    UserError,
)

if TYPE_CHECKING:
    import asyncio


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Run the ``agent-flow`` command and return its exit code (see `agent_flow.cli`).

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        stdin: Where chat messages and approval answers are read (default ``sys.stdin``).
        stdout: Where output goes (default ``sys.stdout``).
        stderr: Where errors go (default ``sys.stderr``).
    """
    streams = _Streams(stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace, _Streams], Coroutine[None, None, int]] = args.handler
    try:
        log = _Logging(getattr(args, "verbose", 0), getattr(args, "log_file", None), streams.stderr)
    except OSError as err:
        _error_line(streams, f"--log-file {args.log_file!r} cannot be written: {err.strerror}")
        return EXIT_USAGE
    with log:
        return _run(handler, args, streams)


def _run(
    handler: Callable[[argparse.Namespace, _Streams], Coroutine[None, None, int]],
    args: argparse.Namespace,
    streams: _Streams,
) -> int:
    import asyncio  # here: ``--help`` and ``--version`` never get this far

    output: _Output | None = None
    terminated = False

    async def command() -> int:
        nonlocal output
        task = asyncio.current_task()
        assert task is not None
        output = _Output(streams.stdout, task)
        if getattr(args, "stop_on_sigterm", False):
            # A run stopped by SIGTERM (a supervisor, `timeout`) ends as Ctrl-C ends it: its
            # session saved as interrupted, not left "active" until someone claims it.
            def terminate() -> None:
                nonlocal terminated
                terminated = True
                task.cancel()

            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
        return await handler(args, dataclasses.replace(streams, stdout=cast(IO[str], output)))

    try:
        return asyncio.run(command())
    except KeyboardInterrupt:
        _error_line(streams, "cancelled")
        return EXIT_CANCELLED
    except (BrokenPipeError, asyncio.CancelledError):
        if terminated:
            _error_line(streams, "terminated")
            return EXIT_TERMINATED
        if output is None or not output.gone:
            raise
        return EXIT_RUN_FAILED  # the reader went away (`... | head`): stopped quietly
    except _Failure as failure:
        _error_line(streams, failure.message)
        return failure.code
    except AgentFlowError as err:
        code, message = _describe_error(err)
        _error_line(streams, message)
        return code


def _describe_error(err: AgentFlowError) -> tuple[int, str]:
    """The exit code and the one-line message for an error that ended the command."""
    if isinstance(err, SessionNotFoundError):
        return EXIT_USAGE, f"{err} (see `agent-flow sessions list`)"
    if isinstance(err, MCPServerTimeoutError):
        return EXIT_USAGE, f"{err}: allow it longer with --mcp-timeout SECONDS"
    if isinstance(err, MCPServerError):
        return EXIT_USAGE, f"an MCP server could not be started: {err}; check its command or URL"
    if isinstance(err, UserError):
        return EXIT_USAGE, str(err)
    if isinstance(err, ModelError):
        return EXIT_MODEL, str(err)
    if isinstance(err, ExportFormatError):  # the file given is at fault, not the store
        return EXIT_USAGE, str(err)
    if isinstance(err, StoreError):
        return EXIT_RUN_FAILED, str(err)
    return EXIT_RUN_FAILED, f"{type(err).__name__}: {err}"


class _OneLine(logging.Formatter):
    """``agent-flow: warning: message``: one line, a traceback only when asked for."""

    def __init__(self, *, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        message = " ".join(record.getMessage().split())
        where = "" if record.name.startswith("agent_flow") else f"{record.name}: "
        line = f"agent-flow: {record.levelname.lower()}: {where}{message}"
        if self.tracebacks and record.exc_info:
            return f"{line}\n{self.formatException(record.exc_info)}"
        return line


class _Logging:
    """The command's one log handler, installed on the root logger while the command runs."""

    def __init__(self, verbosity: int, log_file: str | None, stderr: IO[str]) -> None:
        if verbosity >= 2:
            self.level = logging.DEBUG
        elif verbosity == 1 or log_file is not None:
            self.level = logging.INFO
        else:
            self.level = logging.WARNING
        self.handler: logging.Handler
        if log_file is not None:
            self.handler = logging.FileHandler(log_file, encoding="utf-8", delay=False)
            self.handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
        else:
            self.handler = logging.StreamHandler(stderr)
            self.handler.setFormatter(_OneLine(tracebacks=verbosity >= 2))
            if verbosity == 0:
                # Other libraries speak only when asked (-v): the CLI's errors are one line.
                self.handler.addFilter(lambda record: record.name.startswith("agent_flow"))
        self.handler.setLevel(self.level)
        self._root_level = logging.WARNING

    def __enter__(self) -> _Logging:
        root = logging.getLogger()
        self._root_level = root.level
        root.addHandler(self.handler)
        root.setLevel(min(self.level, root.level))
        logging.captureWarnings(True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        logging.captureWarnings(False)
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self._root_level)
        self.handler.close()


class _Output:
    """A command's stdout, which stops the command once its reader is gone.

    When the reader goes away (`agent-flow run ... --json | head -1`), the command is cancelled
    once, and what is still written goes nowhere, without an error per event (a write to a
    closed pipe raised in every event hook that writes).
    """

    def __init__(self, stream: IO[str], command: asyncio.Task[int]) -> None:
        self._stream = stream
        self._command = command
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.gone = True
        # Python flushes stdout at exit too: onto /dev/null, not into a last error.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        self._command.cancel()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
