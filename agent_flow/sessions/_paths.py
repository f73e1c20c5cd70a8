"""`default_store_path`: where the SQLite session store lives by default.

Its own light module (no models, no sqlite3): the CLI's ``--help`` names the path.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_store_path"]


def default_store_path() -> Path:
    """Return where `SQLiteSessionStore` keeps sessions when given no path.

    ``$AGENT_FLOW_HOME/sessions.db`` if that variable is set, else
    ``$XDG_DATA_HOME/agent_flow/sessions.db`` if that is set to an absolute path, else
    ``~/.local/share/agent_flow/sessions.db``.
    """
    home = os.environ.get("AGENT_FLOW_HOME")
    if home:
        return Path(home).expanduser() / "sessions.db"
    data = os.environ.get("XDG_DATA_HOME")
    if data and Path(data).is_absolute():
        return Path(data) / "agent_flow" / "sessions.db"
    return Path.home() / ".local" / "share" / "agent_flow" / "sessions.db"
