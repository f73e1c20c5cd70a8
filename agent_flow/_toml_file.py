"""Reading a TOML file a user wrote: its document, or one `ConfigError` saying what is wrong.

Every config file agent_flow reads (``agent.toml``, lab candidates, durable settings, a
server's tokens file) comes through `read_toml`, so each mistake reads the same way: a missing
file, a directory, a file that cannot be read, text that is not UTF-8, TOML that does not
parse. A UTF-8 byte order mark, which some editors write, is skipped.
"""

from __future__ import annotations

import codecs
import tomllib
from pathlib import Path
from typing import Any

from agent_flow.errors import ConfigError

__all__ = ["read_toml"]


def read_toml(path: str | Path, *, what: str = "config file") -> dict[str, Any]:
    """The TOML document at `path`, or a `ConfigError` naming `what` and the file.

    Raises:
        ConfigError: The file is missing, a directory, unreadable, not UTF-8, or not TOML.
    """
    name = f"{what} {str(path)!r}"
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError as err:
        raise ConfigError(f"{name} does not exist") from err
    except IsADirectoryError as err:
        raise ConfigError(f"{name} is a directory; name the TOML file in it") from err
    except OSError as err:
        raise ConfigError(f"{name} cannot be read: {err.strerror or err}") from err
    try:
        text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{name} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); "
            "save it as UTF-8"
        ) from err
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{name} is not valid TOML: {err}") from err
