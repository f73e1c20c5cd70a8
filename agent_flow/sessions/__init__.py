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

One writer at a time. A run claims the session (`SessionStore.claim` returns a `Lease`: the run,
who runs it, a fencing number that grows with every claim, an expiry), renews it while it runs and
releases it at its end; each of its writes carries the fence and the run (``save_step(...,
fence=lease.fence, lease_run=lease.run_id)``), checked in the write's transaction, so a run whose
lease was taken over (even by a run of a session deleted and created again under the same id, whose
fences start at 1 again) writes nothing (`LeaseLostError`), and a writer without a lease is refused
while one is live (`SessionBusyError`). A claim that finds a lease expired and never released (its
holder died) stores that run's end (a `RunFinished` with stop reason ``interrupted``). Every stored
event has an id that is never reused (`event_id`: the fence and the event's ``seq``), so readers
resume after the last id they saw (`SessionStore.events_with_ids`, `follow_events_with_ids`).

When to save is the `StepRecorder`'s call (`recorder.SessionRecorder`, which an
`AgentExecutor` given a store uses): it creates the session on the first run, saves every
step and the run's end with its status, and lets a write finish when the run is cancelled.

Modules: `models` (`SessionInfo`, `SessionState`, `SessionStatus`, `Lease`, `event_id`),
`protocol` (`SessionStore`, `StepRecorder`, `default_store_path`), `recorder`
(`SessionRecorder`), `export` (the export format), `sqlite` (durability, concurrency and the
storage schema are described there), `postgres` and `memory`; privately, `_backend` (the rows a
backend stores), `_planner` (what a step writes), `_usage` (a session's usage and cost totals),
`_lease` (who may write: the lease rules every backend applies), `_follow` (reading and
following events) and `_base` (the async store shared by every implementation), and per SQL
dialect its schema, row helpers and lease statements (`_sqlite_schema`, `_sqlite_rows`,
`_sqlite_lease`; `_pg_schema`, `_pg_rows`, `_pg_lease`).

Every name is loaded on first use, so that importing this package (the agent package does,
for the `StepRecorder` protocol) imports neither `sqlite3` nor what the name does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    from agent_flow.sessions.models import (
        EVENT_ID_RUN_BITS,
        Checkpoint,
        Lease,
        SessionInfo,
        SessionState,
        SessionStatus,
        event_id,
        numbering_run,
    )
    from agent_flow.sessions.postgres import PostgresSessionStore
    from agent_flow.sessions.protocol import SessionStore, StepRecorder, default_store_path
    from agent_flow.sessions.recorder import SessionRecorder
    from agent_flow.sessions.sqlite import SCHEMA_VERSION, SQLiteSessionStore

__all__ = [
    "EVENT_ID_RUN_BITS",
    "EXPORT_FORMAT",
    "EXPORT_LINE_ADAPTER",
    "SCHEMA_VERSION",
    "Checkpoint",
    "EndLine",
    "EntryLine",
    "EnvironmentLine",
    "EventLine",
    "ExportLine",
    "InMemorySessionStore",
    "Lease",
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
    "event_id",
    "numbering_run",
    "open_store",
    "store_location",
]

# Where each name lives. `agent_flow.sessions._paths` is light: ``agent-flow --help`` names
# the default store path without loading the models or sqlite3. The rest is imported on first
# use: sqlite3 only with the SQLite store, psycopg (an optional extra) only with PostgreSQL,
# the recorder (which imports the agent package, which imports this one) when used.
_LAZY = {
    "EXPORT_FORMAT": "export",
    "EXPORT_LINE_ADAPTER": "export",
    "EndLine": "export",
    "EntryLine": "export",
    "EnvironmentLine": "export",
    "EventLine": "export",
    "ExportLine": "export",
    "SessionHeaderLine": "export",
    "open_store": "factory",
    "store_location": "factory",
    "InMemorySessionStore": "memory",
    "EVENT_ID_RUN_BITS": "models",
    "Checkpoint": "models",
    "Lease": "models",
    "event_id": "models",
    "numbering_run": "models",
    "SessionInfo": "models",
    "SessionState": "models",
    "SessionStatus": "models",
    "PostgresSessionStore": "postgres",
    "SessionStore": "protocol",
    "StepRecorder": "protocol",
    "default_store_path": "_paths",
    "SessionRecorder": "recorder",
    "SCHEMA_VERSION": "sqlite",
    "SQLiteSessionStore": "sqlite",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
