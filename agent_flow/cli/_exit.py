"""What a command is given and how it ends: its streams, the exit codes, `_Failure`.

Every command is an ``async`` function of the parsed arguments and `_Streams` that returns an
exit code (listed in `agent_flow.cli`), or raises `_Failure` to end with a code and one error
line, which `_error_line` writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_MODEL = 3
EXIT_CANCELLED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process it ended


class _Failure(Exception):
    """Ends the command with `code` after printing `message` as one error line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[object, ...]:
        # The default rebuilds from ``args`` (the message alone) and would lose the code.
        return (type(self), (self.code, self.message))


@dataclass
class _Streams:
    stdin: IO[str]
    stdout: IO[str]
    stderr: IO[str]


def _error_line(streams: _Streams, message: str) -> None:
    streams.stderr.write(f"agent-flow: error: {' '.join(message.split())}\n")
    streams.stderr.flush()


def _flag_failure(err: ValidationError) -> _Failure:
    """The usage error for settings made from flags: the first problem, named by its flag."""
    first = err.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["loc"]:
        message = f"--{str(first['loc'][0]).replace('_', '-')}: {message}"
    return _Failure(EXIT_USAGE, message)
