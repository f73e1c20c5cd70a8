"""Sessions: a run's history, environment and events, saved after every step, and reloaded.

This package owns `SessionInfo`, `SessionState`, the `SessionStore` protocol with its
implementations — `SQLiteSessionStore` (the default: one file, no server),
`PostgresSessionStore` (a shared database, the ``postgres`` extra) and `InMemorySessionStore`
(the same semantics, for tests) — `open_store` (a store from a URL or path), and the JSON-lines
export format.

A session is created once (`SessionStore.create`), then saved at every step boundary with
`SessionStore.save_step(id, history=..., environment=..., events=...)`; `load` gives back its
entries and environment (``state.history()`` rebuilds a `History`) to resume it with a new user
message. Call `save_step` only when the history is consistent (every tool call answered): that is
what a reader finds, because a step is one transaction.

Cost of a step. `save_step` writes what is new, not the session: the store remembers, per
session, the entries it saved last (the very objects), the `History` and `Environment` objects
it saw and their versions. When the same history only grew since (nothing replaced since that
save, per `History.replaced_version`) the new entries are appended; otherwise (pruned,
summarized, elided — whatever a strategy returned, shorter, longer or rewritten — or another
history object) the saved entries are compared with the history's and the rows from the first
difference on are rewritten, in the same transaction. Events are appended. The environment is
kept as its latest snapshot *without* its change log, plus the change log as rows: a step
writes the snapshot and the changes made since the last step (none of it when the version did
not move), and trims changes that fell out of ``max_changes``, so `load` rebuilds an
environment whose `Environment.to_json` is exactly what was saved. The session's usage totals
(`SessionInfo.model_calls`, tokens, ``cost_usd``) grow by the step's ``ModelResponded`` events
in the same transaction (see `_usage`).

When to save is the `StepRecorder`'s call (`recorder.SessionRecorder`, which an
`AgentExecutor` given a store uses): it creates the session on the first run, saves every
step and the run's end with its status, and lets a write finish when the run is cancelled.

Modules: `models` (`SessionInfo`, `SessionState`, `SessionStatus`), `protocol`
(`SessionStore`, `StepRecorder`, `default_store_path`), `recorder` (`SessionRecorder`),
`export` (the export format), `sqlite` (durability, concurrency and the storage schema are
described there) and `memory`; privately, `_backend` (the rows a backend stores), `_planner`
(what a step writes), `_usage` (a session's usage and cost totals) and `_base` (the async
store shared by both implementations).

`SQLiteSessionStore` and `SCHEMA_VERSION` are loaded on first use, so that importing
`agent_flow` (which imports this package for the `SessionStore` protocol) does not import
`sqlite3`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_flow.sessions.export import (
    EXPORT_FORMAT,
    EXPORT_LINE_ADAPTER,
    EndLine,
    EntryLine,
    EnvironmentLine,
    EventLine,
    ExportLine,
    SessionHeaderLine,
)
from agent_flow.sessions.factory import open_store, store_location
from agent_flow.sessions.memory import InMemorySessionStore
from agent_flow.sessions.models import SessionInfo, SessionState, SessionStatus
from agent_flow.sessions.protocol import SessionStore, StepRecorder, default_store_path

if TYPE_CHECKING:
    from agent_flow.sessions.postgres import PostgresSessionStore
    from agent_flow.sessions.recorder import SessionRecorder
    from agent_flow.sessions.sqlite import SCHEMA_VERSION, SQLiteSessionStore

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_LINE_ADAPTER",
    "SCHEMA_VERSION",
    "EndLine",
    "EntryLine",
    "EnvironmentLine",
    "EventLine",
    "ExportLine",
    "InMemorySessionStore",
    "PostgresSessionStore",
    "SQLiteSessionStore",
    "SessionHeaderLine",
    "SessionInfo",
    "SessionRecorder",
    "SessionState",
    "SessionStatus",
    "SessionStore",
    "StepRecorder",
    "default_store_path",
    "open_store",
    "store_location",
]

_SQLITE_NAMES = frozenset(("SCHEMA_VERSION", "SQLiteSessionStore"))


def __getattr__(name: str) -> object:
    # sqlite3 is not needed by the protocol or the in-memory store: load it when used.
    if name in _SQLITE_NAMES:
        from agent_flow.sessions import sqlite

        return getattr(sqlite, name)
    # psycopg is an optional extra: load it only when a PostgreSQL store is used.
    if name == "PostgresSessionStore":
        from agent_flow.sessions.postgres import PostgresSessionStore

        return PostgresSessionStore
    # The recorder imports the agent package, which imports this one: load it when used.
    if name == "SessionRecorder":
        from agent_flow.sessions.recorder import SessionRecorder

        return SessionRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
