"""`main`: parse the arguments, run the command, and map what ended it to an exit code.

The codes and their meaning are listed in `agent_flow.cli`; errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import IO

from agent_flow.cli._exit import (
    EXIT_CANCELLED,
    EXIT_MODEL,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    _error_line,
    _Failure,
    _Streams,
)
from agent_flow.cli._parser import build_parser
from agent_flow.errors import (
    AgentFlowError,
    MCPServerError,
    ModelError,
    SessionNotFoundError,
    StoreError,
    UserError,
)


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
        return asyncio.run(handler(args, streams))
    except KeyboardInterrupt:
        _error_line(streams, "cancelled")
        return EXIT_CANCELLED
    except BrokenPipeError:
        # The reader went away (`agent-flow sessions export ID | head`): stop quietly.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), streams.stdout.fileno())
        return EXIT_RUN_FAILED
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
    if isinstance(err, MCPServerError):
        return EXIT_USAGE, f"an MCP server could not be started: {err}; check its command or URL"
    if isinstance(err, UserError):
        return EXIT_USAGE, str(err)
    if isinstance(err, ModelError):
        return EXIT_MODEL, str(err)
    if isinstance(err, StoreError):
        return EXIT_RUN_FAILED, str(err)
    return EXIT_RUN_FAILED, f"{type(err).__name__}: {err}"
