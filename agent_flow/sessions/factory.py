"""`open_store`: the one place a session store is chosen from configuration (a URL or a path).

``--db`` on the command line and ``[store] url`` in a config file both end here, so every
command selects the same store for the same text.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agent_flow.errors import ConfigError
from agent_flow.sessions.memory import InMemorySessionStore
from agent_flow.sessions.protocol import SessionStore

__all__ = ["open_store", "store_kind", "store_location"]

_POSTGRES = ("postgresql", "postgres")


def store_kind(target: str | Path | None) -> str:
    """Return ``"postgres"``, ``"sqlite"`` or ``"memory"``: the store `open_store` would make.

    Raises:
        ConfigError: `target` is a URL of a kind no store handles.
    """
    if target is None or isinstance(target, Path):
        return "sqlite"
    scheme = urlsplit(target).scheme if "://" in target else ""
    if scheme in _POSTGRES:
        return "postgres"
    if scheme == "sqlite":
        return "sqlite"
    if target in ("memory", "memory://") or scheme == "memory":
        return "memory"
    if scheme:
        raise ConfigError(
            f"the store URL {target.split('://')[0]}://... is of no known kind; use a file path, "
            "sqlite:///path, postgresql://user@host/database or memory://"
        )
    return "sqlite"


def open_store(target: str | Path | None = None) -> SessionStore:
    """Return the session store `target` names (not yet opened: use ``async with``).

    Args:
        target: None for the default SQLite file (`default_store_path`); a file path or
            ``sqlite:///path`` for a SQLite file; ``postgresql://user@host:5432/database``
            (``postgres://`` too) for PostgreSQL, with an optional ``?schema=name`` naming the
            PostgreSQL schema to keep the tables in; ``memory://`` for a throwaway store.

    Raises:
        ConfigError: The URL is of no known kind, or it names PostgreSQL and the ``postgres``
            extra is not installed.
    """
    kind = store_kind(target)
    if kind == "memory":
        return InMemorySessionStore()
    if kind == "postgres":
        assert isinstance(target, str)
        parts = urlsplit(target)
        query = parse_qsl(parts.query, keep_blank_values=True)
        schema = next((value for key, value in query if key == "schema"), None)
        rest = urlencode([(key, value) for key, value in query if key != "schema"])
        url = urlunsplit(parts._replace(query=rest))
        try:
            from agent_flow.sessions.postgres import PostgresSessionStore
        except ImportError as err:
            raise ConfigError(
                f"a postgresql:// store needs psycopg ({err}); install it with "
                "pip install 'agent-flow[postgres]'"
            ) from err
        return PostgresSessionStore(url, schema=schema or None)
    from agent_flow.sessions.sqlite import SQLiteSessionStore

    if isinstance(target, str) and target.startswith("sqlite://"):
        path = urlsplit(target).path
        if not path:
            raise ConfigError(f"{target!r} names no file; write sqlite:///path/to/sessions.db")
        return SQLiteSessionStore(path)
    return SQLiteSessionStore(target)


def store_location(store: SessionStore) -> str:
    """Return where `store` keeps its sessions, to show a user.

    A path, or a URL without its password: what ``--db`` takes to open the same store again.
    """
    path = getattr(store, "path", None)
    if path is not None:
        return str(path)
    location = getattr(store, "location", None)
    if isinstance(location, str):
        return location
    return "memory://" if isinstance(store, InMemorySessionStore) else repr(store)
