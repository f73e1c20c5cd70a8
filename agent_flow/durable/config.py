"""`DurableConfig`: the ``[durable]`` table, how runs become durable DBOS workflows."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_flow._defaults import (
    DURABLE_APP_NAME,
    DURABLE_IDLE_SECONDS,
    DURABLE_POLL_SECONDS,
    DURABLE_QUEUE,
    DURABLE_SQLITE_FILE,
)
from agent_flow.errors import ConfigError

__all__ = ["DurableConfig", "libpq_url", "load_durable_config"]


class DurableConfig(BaseModel):
    """How runs are made durable (the ``[durable]`` table of an agent.toml).

    Attributes:
        enabled: Run agents as DBOS workflows through a queue (``durable = true``).
        system_database_url: DBOS's system database: ``postgresql://...`` to share runs
            between processes and machines, ``sqlite:///path`` for one machine; None: a
            SQLite file beside the session store (``AGENT_FLOW_HOME`` or the data dir).
        queue: The DBOS queue runs are enqueued on.
        worker_concurrency: Runs one worker process executes at once (None: no limit).
        global_concurrency: Runs executing at once across every worker (None: no limit).
        executor_id: This process's DBOS executor id (None: a new one per process). A
            worker restarted with its old id takes back its own unfinished runs at once.
        poll_seconds: On a SQLite system database, how often a worker looks for queued runs
            (every fifth look also for the runs of dead workers).
        idle_seconds: On a PostgreSQL system database, where enqueuing a run notifies the
            workers at once (LISTEN/NOTIFY), how often an idle worker still looks for queued
            runs and for the runs of dead workers (None: 5 s). Ignored on SQLite.
        app_name: The DBOS application name every process of one deployment shares.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = False
    system_database_url: str | None = Field(default=None, min_length=1)
    queue: str = Field(default=DURABLE_QUEUE, min_length=1)
    worker_concurrency: int | None = Field(default=None, ge=1)
    global_concurrency: int | None = Field(default=None, ge=1)
    executor_id: str | None = Field(default=None, min_length=1)
    poll_seconds: float = Field(default=DURABLE_POLL_SECONDS, gt=0)
    idle_seconds: float | None = Field(default=None, gt=0)
    app_name: str = Field(default=DURABLE_APP_NAME, pattern=r"^[a-z0-9_-]{3,256}$")

    def resolved_url(self) -> str:
        """The system database URL, the local SQLite default when none is set."""
        if self.system_database_url is not None:
            return self.system_database_url
        from agent_flow.sessions.protocol import default_store_path

        path = default_store_path().with_name(DURABLE_SQLITE_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"

    def notified(self) -> bool:
        """Whether workers are told of queued runs (a PostgreSQL system database)."""
        return libpq_url(self.resolved_url()) is not None

    def resolved_idle_seconds(self) -> float:
        """How often an idle worker looks for queued runs nothing told it of."""
        if not self.notified():
            return self.poll_seconds
        return self.idle_seconds if self.idle_seconds is not None else DURABLE_IDLE_SECONDS

    def watch_seconds(self) -> float:
        """How often a worker looks for the runs of dead workers."""
        return self.resolved_idle_seconds() if self.notified() else self.poll_seconds * 5


def libpq_url(system_database_url: str) -> str | None:
    """The system database's URL as libpq takes it, or None if it is not PostgreSQL.

    A SQLAlchemy driver suffix (``postgresql+psycopg://``) is dropped; SQLite gives None.
    """
    scheme, _, rest = system_database_url.partition("://")
    if not scheme.startswith(("postgresql", "postgres")):
        return None
    return f"postgresql://{rest}"


def load_durable_config(path: str | Path | None) -> DurableConfig:
    """Read the ``[durable]`` table of a TOML config file (defaults: not durable).

    Raises:
        ConfigError: The file is missing or not TOML, or ``[durable]`` is invalid; the message
            names the key and the file.
    """
    if path is None:
        return DurableConfig()
    from agent_flow._toml_file import read_toml

    document = read_toml(path)
    table = document.get("durable", {})
    if not isinstance(table, dict):
        raise ConfigError(f"[durable] in {path} must be a table, e.g. enabled = true")
    try:
        return DurableConfig.model_validate(table)
    except ValidationError as err:
        item = err.errors()[0]
        where = ".".join(str(part) for part in item["loc"])
        raise ConfigError(f"invalid [durable] {where} in {path}: {item['msg']}") from err


#: How a durable run's steps are laid out in its checkpoints (positions, what is recorded).
#: A run is recovered only by workers of the same layout: a change bumps it.
#: 2: a turn's tool calls run side by side at reserved positions, and each turn records
#: where its events left the run's sequence.
STEP_LAYOUT = 2


def app_version() -> str:
    """The DBOS application version of this deployment's processes.

    DBOS recovers and dequeues a run only on processes of the version that enqueued it, so
    runs started by another agent_flow, or another step layout, are left to its own workers.
    """
    from agent_flow import __version__

    return f"agent_flow-{__version__}+steps{STEP_LAYOUT}"
