"""Where a test store's data lives, on memory, SQLite or PostgreSQL (a fresh schema each)."""

from __future__ import annotations

import uuid
from pathlib import Path

from agent_flow.sessions import open_store
from agent_flow.sessions.protocol import SessionStore
from tests.store_helpers.postgres import URL, drop_schema, require_postgres


class Backing:
    """Where a store's data lives; `open` makes a new store object on that same data."""

    def __init__(self, kind: str, folder: Path, *, prefix: str = "af_test") -> None:
        self.kind = kind
        self.schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
        if kind == "postgres":
            require_postgres()
            self.target = f"{URL}?schema={self.schema}"
        elif kind == "sqlite":
            self.target = f"sqlite://{folder / 'sessions.db'}"
        else:
            self.target = "memory://"

    def open(self, *, notified_only: bool = False) -> SessionStore:
        """A new store object on this data; `notified_only`: PostgreSQL followers never poll."""
        store = open_store(self.target)
        if notified_only and self.kind == "postgres":
            store._follow_poll = 3600.0  # type: ignore[attr-defined]
        return store

    def drop(self) -> None:
        """Drop the PostgreSQL schema (SQLite's folder is the test's tmp_path)."""
        if self.kind == "postgres":
            drop_schema(self.schema)
