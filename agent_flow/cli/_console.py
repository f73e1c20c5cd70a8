"""The console the command prints to: colour, a spinner and wrapping on a terminal only.

`agent_flow.cli.render` exports `make_console` beside the renderers that print to it.
"""

from __future__ import annotations

import sys
from typing import IO

from rich.console import Console

__all__ = ["make_console"]


def make_console(
    stream: IO[str] | None = None,
    *,
    force_terminal: bool | None = None,
    width: int | None = None,
) -> Console:
    """A console for the command: colour and a spinner on a terminal, plain text elsewhere.

    On a terminal, lines wrap at word boundaries to its width (or `width`). Output that is not
    a terminal is never wrapped (so it reads the same at any width) and has no colour codes.
    """
    file = stream if stream is not None else sys.stdout
    is_tty = force_terminal if force_terminal is not None else _isatty(file)
    return Console(
        file=file,
        force_terminal=is_tty,
        color_system="auto" if is_tty else None,
        width=width if is_tty else 120,
        soft_wrap=not is_tty,
        highlight=False,
        emoji=False,
        markup=False,
    )


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
