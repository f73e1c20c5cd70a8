"""`DurableWorker`: a process that executes queued runs, and recovers the runs of dead ones.

A worker launches DBOS in this process (its executor id, the deployment's system database),
registers the queue with its concurrency limits, and executes the runs DBOS dequeues for it
(`agent_flow.durable._workflow`) as soon as it is told of them (`agent_flow.durable._wake`:
LISTEN/NOTIFY on PostgreSQL, a poll on SQLite). Every `DurableConfig.watch_seconds` it also
looks at the runs pending on other executors: an executor whose liveness lock it can take is
gone (see `agent_flow.durable._liveness`), and its runs are handed back to the queue
(``DBOS.resume_workflows``, DBOS's public API), then finished by whichever worker dequeues
them, from their last recorded step.

Recovery is at-least-once for the step a crash interrupted (a model call is made again; a
tool call runs again only if its tool is idempotent, see `ToolPolicy.idempotent`); every
step recorded before the crash is replayed from its record and never executed again.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Self

from dbos import DBOS, DBOSClient

from agent_flow._defaults import (
    DURABLE_DBOS_HOUSEKEEPING_SECONDS,
    DURABLE_NOTIFY_COALESCE_SECONDS,
)
from agent_flow._eager import to_the_end
from agent_flow._utils import cancel_and_wait
from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig
from agent_flow.durable._liveness import Liveness, liveness_for
from agent_flow.durable._wake import (
    Dequeuer,
    SystemReads,
    quiet_dbos,
    stop_dbos_queue_threads,
    wake_payload,
)
from agent_flow.durable._workflow import LLMFactory, Runtime, ToolsFactory, install
from agent_flow.durable.config import DurableConfig, app_version, libpq_url
from agent_flow.sessions.protocol import SessionStore

__all__ = ["DurableWorker", "dbos_config"]

logger = logging.getLogger("agent_flow.durable")


def dbos_config(durable: DurableConfig, executor_id: str) -> Any:
    """The DBOS configuration of a process of this deployment."""
    return {
        "name": durable.app_name,
        "system_database_url": durable.resolved_url(),
        "executor_id": executor_id,
        # One version for every process of a deployment, so any worker may recover any run.
        "application_version": app_version(),
        "notification_listener_polling_interval_sec": durable.poll_seconds,
        # DBOS pushes its events' and streams' notifications (agent_flow uses neither) from a
        # thread that wakes this often: 100 times a second by default.
        "notification_coalesce_sec": DURABLE_NOTIFY_COALESCE_SECONDS,
        "log_level": "WARNING",
    }


def _load_tokenizer(config: AgentConfig) -> None:
    from agent_flow.agent import counter_for

    counter_for(config).count("warm up")


class DurableWorker:
    """Executes durable runs in this process (use as ``async with``; one per process).

    Args:
        durable: The deployment's durable settings.
        store: The session store runs record into (the caller opens and closes it).
        config: The agent config of runs whose request carries none.
        llm_factory: Builds a run's model client (default: `OpenAIClient` from the config).
        tools_factory: Builds a run's tools (default: from the config).
        concurrency: Runs this worker executes at once (default:
            `DurableConfig.worker_concurrency`).
        on_agent: Called with each run's agent before it runs (``agent_flow.telemetry.
            instrument`` traces the runs; see `Runtime`).
    """

    def __init__(
        self,
        durable: DurableConfig,
        store: SessionStore,
        config: AgentConfig | None = None,
        *,
        llm_factory: LLMFactory | None = None,
        tools_factory: ToolsFactory | None = None,
        concurrency: int | None = None,
        on_agent: Callable[[AgentExecutor], object] | None = None,
    ) -> None:
        self.durable = durable
        self.executor_id = durable.executor_id or f"worker-{uuid.uuid4().hex[:12]}"
        self._runtime = Runtime(
            store=store,
            config=config if config is not None else AgentConfig(),
            llm_factory=llm_factory,
            tools_factory=tools_factory,
            on_agent=on_agent,
        )
        self._concurrency = concurrency if concurrency is not None else durable.worker_concurrency
        self._liveness: Liveness | None = None
        self._watch: asyncio.Task[None] | None = None
        self._reader: DBOSClient | None = None
        self._dequeuer: Dequeuer | None = None
        self._reads: SystemReads | None = None
        #: Whether DBOS's own queue threads were stopped (`_wake.stop_dbos_queue_threads`).
        self.dbos_queue_threads_stopped = False

    async def start(self) -> None:
        """Take this worker's liveness lock, launch DBOS and start watching for dead workers."""
        url = self.durable.resolved_url()
        self._liveness = liveness_for(url)
        await self._liveness.hold(self.executor_id)
        # Status reads outside any workflow: a run's cancellation checks record nothing.
        self._reader = DBOSClient(system_database_url=url, application_name=self.durable.app_name)
        self._runtime.status = self._status
        # The configured model's tokenizer, loaded now rather than inside the first run.
        _load_tokenizer(self._runtime.config)
        install(self._runtime)
        DBOS(config=dbos_config(self.durable, self.executor_id))
        idle = self.durable.resolved_idle_seconds()
        # Launched from this event loop: DBOS runs the dequeued workflows on it.
        quiet_dbos(DURABLE_DBOS_HOUSEKEEPING_SECONDS)
        DBOS.launch()
        quiet_dbos(DURABLE_DBOS_HOUSEKEEPING_SECONDS)
        self.dbos_queue_threads_stopped = stop_dbos_queue_threads()
        queue = await DBOS.register_queue_async(
            self.durable.queue,
            worker_concurrency=self._concurrency,
            global_concurrency=self.durable.global_concurrency,
            # Partitioned by session (`DurableClient.enqueue`): one run of a session executes
            # at a time across the fleet; the next waits in the queue, not in a worker's slot.
            partition_concurrency=1,
            # Read only by DBOS's own queue threads, which run where they cannot be stopped
            # (`_wake.stop_dbos_queue_threads`): this worker dequeues when told.
            polling_interval_sec=idle,
            on_conflict="always_update",
        )
        # Its limits as registered, not read back from the database on every pass.
        local = copy.copy(queue)
        local.database_backed_queue = False
        notified = libpq_url(url)
        if notified is not None:
            self._reads = SystemReads(self._liveness.query)
        self._dequeuer = Dequeuer(
            local,
            wake_payload(self.durable.app_name, self.durable.queue),
            notified,
            idle,
            self._anything_queued if self._reads is not None else None,
        )
        self._runtime.after_run = self._dequeuer.poke
        await self._dequeuer.start()
        self._watch = asyncio.create_task(self._recover_dead_workers())

    async def aclose(self) -> None:
        """Stop executing runs (unfinished ones stay pending, for recovery) and shut DBOS down."""
        watch, self._watch = self._watch, None
        try:
            if watch is not None:
                await cancel_and_wait(watch)
        finally:  # (cancelled meanwhile: the rest still stops)
            await self._shut_down()

    async def _shut_down(self) -> None:
        try:
            if self._dequeuer is not None:
                await self._dequeuer.aclose()
        finally:  # (cancelled meanwhile: DBOS still stops)
            await self._shut_down_dbos()

    async def _shut_down_dbos(self) -> None:
        try:
            await to_the_end(asyncio.ensure_future(asyncio.to_thread(DBOS.destroy)))
        finally:  # (cancelled meanwhile: the rest is still undone)
            # DBOS made its thread pool this loop's default and has shut it down: give the
            # loop a working one back (``asyncio.to_thread`` after a worker stopped, or a
            # next worker).
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())
            install(None)
            if self._reader is not None:
                self._reader.destroy()
                self._reader = None
            if self._liveness is not None:
                await self._liveness.aclose()
                self._liveness = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _status(self, run_id: str) -> str | None:
        assert self._reader is not None
        try:
            handle: Any = await self._reader.retrieve_workflow_async(run_id)
            status = await handle.get_status()
        except Exception:  # not found (deleted): nothing to cancel
            return None
        return str(status.status)

    async def serve_forever(self) -> None:
        """Execute runs until cancelled."""
        await asyncio.Event().wait()

    async def _anything_queued(self) -> bool:
        assert self._reads is not None
        return await self._reads.anything_queued(self.durable.queue)

    async def recover_dead_workers(self) -> list[str]:
        """Hand the runs of every dead executor back to the queue; return those executors."""
        assert self._liveness is not None
        found = await self._reads.pending_owners() if self._reads is not None else None
        if found is None:
            pending = await DBOS.list_workflows_async(
                status="PENDING", load_input=False, load_output=False
            )
            found = {w.executor_id for w in pending if w.executor_id}
        owners = sorted(found - {self.executor_id})
        recovered: list[str] = []
        for owner in owners:
            if not await self._liveness.claim_if_dead(owner):
                continue
            try:
                # Read again under the lock: only runs still pending on the dead executor.
                runs = await DBOS.list_workflows_async(
                    status="PENDING",
                    executor_id=owner,
                    app_version=app_version(),
                    load_input=False,
                    load_output=False,
                )
                ids = [run.workflow_id for run in runs]
                if ids:
                    await DBOS.resume_workflows_async(ids, queue_name=self.durable.queue)
                    if self._dequeuer is not None:
                        self._dequeuer.poke()
                logger.warning(
                    "executor %s is gone: %d run(s) handed back to the queue", owner, len(ids)
                )
                recovered.append(owner)
            finally:
                await self._liveness.release(owner)
        return recovered

    async def _recover_dead_workers(self) -> None:
        while True:
            try:
                assert self._liveness is not None
                # Our own lock first: a dropped connection is made again and the lock re-taken
                # before we judge anyone else (see `_liveness`).
                await self._liveness.check()
                await self.recover_dead_workers()
            except Exception:  # a failed pass is retried at the next one
                logger.exception("looking for the runs of dead workers failed")
            await asyncio.sleep(self.durable.watch_seconds())
