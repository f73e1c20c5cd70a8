"""How a worker learns of queued runs: told at once, looking for itself only seldom.

DBOS finds queued runs by polling its queue (three transactions a look). A worker here is
told instead:

- on a PostgreSQL system database, enqueuing a run sends a notification (``NOTIFY`` on
  `CHANNEL`, see `Notifier`), which every worker of the deployment ``LISTEN``s for on a
  connection of its own;
- a run that ends in this worker wakes it too (its session's next run, or a slot it freed,
  may now be taken);
- and a worker looks anyway every ``DurableConfig.resolved_idle_seconds()``, for a
  notification lost while its connection was down (it also looks at once after connecting
  again).

`Dequeuer` owns this process's dequeueing of the deployment's queue: one pass at a time, so
the worker's concurrency limit holds. A pass is one iteration of DBOS's own queue loop
(``dbos._queue.queue_worker_thread``, given a stop event that lets exactly one pass through),
so the claim (partitions, concurrency limits, application version) is DBOS's own code, not a
copy. DBOS's own queue threads are stopped in a worker (`stop_dbos_queue_threads`: they list
the queues every second and poll each one); where that fails (a newer DBOS), they poll the
queue every idle period beside the `Dequeuer`.

Who owns what: the `Dequeuer` and its LISTEN connection belong to the `DurableWorker` that
started them and end with it; a dropped LISTEN connection is made again after
`EVENTS_RECONNECT_SECONDS` (and the queue looked at). A `Notifier` belongs to its
`DurableClient`; a notification it fails to send costs the run at most one idle period's wait,
never the run (it is enqueued before it is announced).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent_flow._defaults import EVENTS_RECONNECT_SECONDS
from agent_flow._utils import cancel_and_wait

if TYPE_CHECKING:
    from psycopg import AsyncConnection, Connection

__all__ = ["CHANNEL", "Dequeuer", "Notifier", "SystemReads", "wake_payload"]

#: The PostgreSQL notification channel; the payload names the deployment and queue.
CHANNEL = "agent_flow_queue"

logger = logging.getLogger("agent_flow.durable")


def wake_payload(app_name: str, queue: str) -> str:
    """What a notification carries: which deployment's queue has a new run."""
    return f"{app_name}/{queue}"


class _OnePass:
    """A stop event for DBOS's queue loop that lets exactly one pass through.

    The loop checks ``is_set`` (not yet), waits its polling interval (``wait``: returns at
    once, unset, the first time), makes one pass, and waits again: now set, it returns.
    """

    def __init__(self) -> None:
        self._waits = 0

    def is_set(self) -> bool:
        return self._waits > 1

    def wait(self, timeout: float | None = None) -> bool:
        self._waits += 1
        return self._waits > 1


def _one_pass(queue: Any) -> None:
    """Claim and start what this worker may take of `queue` now (DBOS's own claim)."""
    from dbos._dbos import _get_dbos_instance
    from dbos._queue import queue_worker_thread

    queue_worker_thread(_OnePass(), _get_dbos_instance(), queue)  # type: ignore[arg-type]


class Dequeuer:
    """Starts this worker's share of the queue's runs when told, and every `idle_seconds`.

    Args:
        queue: The DBOS queue as registered (its limits are used as they are, without reading
            them back from the database on every pass).
        payload: The notification payload that names this queue (`wake_payload`).
        url: The PostgreSQL URL to LISTEN on (None: no notifications; look every
            `idle_seconds`).
        idle_seconds: The longest wait between two looks when nothing wakes the worker.
        queued: Answers, cheaply, whether anything is queued: a look nothing woke the worker
            for is skipped when it says no (None: always look).
    """

    def __init__(
        self,
        queue: Any,
        payload: str,
        url: str | None,
        idle_seconds: float,
        queued: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._queue = queue
        self._payload = payload
        self._url = url
        self._idle = idle_seconds
        self._queued = queued
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Passes made, and notifications taken (for tests and logs).
        self.passes = 0
        self.notified = 0
        #: Times the LISTEN connection was made (again).
        self.connects = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.create_task(self._passes()))
        if self._url is not None:
            self._tasks.append(asyncio.create_task(self._listen()))

    async def aclose(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()

    def poke(self) -> None:
        """Look at the queue soon (from any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    async def _passes(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._idle)
            except TimeoutError:  # nothing woke us: look only if something is queued
                if self._queued is not None and not await self._queued():
                    continue
            self._wake.clear()
            try:
                await asyncio.to_thread(_one_pass, self._queue)
            except Exception:  # retried at the next wake or idle look
                logger.exception("looking for queued runs failed")
            self.passes += 1

    async def _listen(self) -> None:
        import psycopg

        assert self._url is not None
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, keepalives=1, keepalives_idle=30
                )
            except Exception as err:
                logger.warning("cannot LISTEN for queued runs (%s); retrying", err)
                await asyncio.sleep(EVENTS_RECONNECT_SECONDS)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.connects += 1
                    self.poke()  # runs enqueued while not listening
                    await self._take_notifications(conn)
            except Exception as err:
                logger.warning("the LISTEN connection for queued runs dropped (%s)", err)
                await asyncio.sleep(EVENTS_RECONNECT_SECONDS)

    async def _take_notifications(self, conn: AsyncConnection[Any]) -> None:
        """Wake on each notification for this queue, until the connection fails.

        Reads the socket only when it is readable (psycopg's ``notifies()`` wakes ten times
        a second to look for a cancellation: a cost an idle worker would pay all day).
        """
        import psycopg

        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = conn.fileno()
        loop.add_reader(fd, readable.set)
        payload = self._payload.encode()
        try:
            while True:
                await readable.wait()
                readable.clear()
                pgconn = conn.pgconn
                pgconn.consume_input()  # raises once the server or the network dropped it
                if pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the connection is closed")
                while (notify := pgconn.notifies()) is not None:
                    if notify.extra == payload:
                        self.notified += 1
                        self._wake.set()
        finally:
            loop.remove_reader(fd)


#: Reads of DBOS's system tables (its default schema, ``dbos``) for an idle worker's looks.
#: What they find is acted on through DBOS's own API; they only spare its heavier queries
#: (about 5 ms of CPU each) when there is nothing to find.
_QUEUED = (
    "SELECT EXISTS (SELECT 1 FROM dbos.workflow_status"
    " WHERE status = 'ENQUEUED' AND queue_name = %s)"
)
_PENDING_OWNERS = (
    "SELECT DISTINCT executor_id FROM dbos.workflow_status"
    " WHERE status = 'PENDING' AND executor_id IS NOT NULL"
)


class SystemReads:
    """Cheap reads of DBOS's system tables, over the worker's own connection.

    Where a read fails (a DBOS that moved its tables, a dropped connection) the caller is told
    "don't know" and does the full look; a missing table or column turns the reads off.
    """

    def __init__(
        self, query: Callable[[str, tuple[object, ...]], Awaitable[list[tuple[object, ...]] | None]]
    ) -> None:
        self._query = query
        self._off = False

    async def _rows(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]] | None:
        if self._off:
            return None
        try:
            return await self._query(sql, params)
        except Exception as err:
            import psycopg

            if isinstance(err, psycopg.ProgrammingError):
                self._off = True
                logger.warning(
                    "DBOS's system tables are not as expected (%s): looking in full", err
                )
            return None

    async def anything_queued(self, queue: str) -> bool:
        """Whether `queue` may hold a run to start (True when it cannot tell)."""
        rows = await self._rows(_QUEUED, (queue,))
        return rows is None or bool(rows[0][0])

    async def pending_owners(self) -> set[str] | None:
        """The executors with runs pending (None when it cannot tell)."""
        rows = await self._rows(_PENDING_OWNERS, ())
        return None if rows is None else {str(row[0]) for row in rows}


class Notifier:
    """Tells the deployment's workers that a run was enqueued (PostgreSQL ``NOTIFY``).

    One connection, made on first use and made again after it drops; sends are serialized.
    """

    def __init__(self, url: str, payload: str) -> None:
        self._url = url
        self._payload = payload
        self._conn: Connection[tuple[object, ...]] | None = None
        self._lock = threading.Lock()

    def _send(self) -> None:
        import psycopg

        with self._lock:
            for attempt in (1, 2):
                conn = self._conn
                if conn is None or conn.closed or conn.broken:
                    conn = self._conn = psycopg.Connection.connect(self._url, autocommit=True)
                try:
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self._payload))
                    return
                except psycopg.OperationalError:
                    with contextlib.suppress(Exception):
                        conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise

    async def notify(self) -> None:
        """Send the notification; a failure is logged (the workers' idle look finds the run)."""
        try:
            await asyncio.to_thread(self._send)
        except Exception as err:
            logger.warning("could not notify the workers of a queued run: %s", err)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def on_done(callback: Callable[[], None]) -> None:
    """Call `callback` when the current task ends.

    In a DBOS workflow that is after its outcome is recorded: its session's next run can be
    claimed by then.
    """
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _task: callback())


#: DBOS's own periodic work this worker slows to its idle period, as (module, attribute):
#: the sweep for delayed workflows and DBOS workflow timeouts (agent_flow uses neither).
_DBOS_HOUSEKEEPING = ("dbos._workflow_commands", "_BACKGROUND_JOBS_INTERVAL_SEC")


def quiet_dbos(idle_seconds: float) -> list[str]:
    """Slow DBOS's housekeeping that agent_flow does not use to one pass per `idle_seconds`.

    Two intervals DBOS does not expose: its background jobs (delayed workflows, DBOS workflow
    timeouts: three transactions a second) and the poll of its internal queue (which serves
    DBOS's scheduler, Kafka, and resuming a workflow without naming a queue: one a second).
    Call before ``DBOS.launch()`` for the first, after it for the second. Process-wide: a
    DBOS application sharing this process sees its delayed workflows and timeouts acted on
    at this pace. Returns what it could not find (a newer DBOS), which is logged and left.
    """
    import importlib

    missing: list[str] = []
    module_name, attribute = _DBOS_HOUSEKEEPING
    module = importlib.import_module(module_name)
    if isinstance(getattr(module, attribute, None), float):
        setattr(module, attribute, max(getattr(module, attribute), idle_seconds))
    else:
        missing.append(f"{module_name}.{attribute}")
    try:
        from dbos._dbos import _get_dbos_instance

        internal = _get_dbos_instance()._registry.get_internal_queue()
        if isinstance(getattr(internal, "_polling_interval_sec", None), float):
            internal._polling_interval_sec = max(internal._polling_interval_sec, idle_seconds)
        else:
            missing.append("the internal queue's polling interval")
    except Exception:  # no DBOS instance yet, or a newer layout
        missing.append("the internal queue")
    for what in missing:
        logger.info("DBOS's %s not found: its housekeeping keeps DBOS's own pace", what)
    return missing


def stop_dbos_queue_threads() -> bool:
    """Stop DBOS's queue manager and its per-queue pollers in this process (after launch).

    The `Dequeuer` does their work when told. The manager lists the deployment's queues every
    second (two transactions) and polls DBOS's internal queue, which serves DBOS's scheduler,
    Kafka and resuming without a queue name (agent_flow uses none of them). True if stopped;
    False (logged) if this DBOS starts them differently, and they go on.
    """
    try:
        from dbos._dbos import _get_dbos_instance
        from dbos._queue import queue_thread

        for thread in _get_dbos_instance()._background_threads:
            if getattr(thread, "_target", None) is queue_thread:
                stop = thread._args[0]  # type: ignore[attr-defined]
                stop.set()
                return True
    except Exception:  # a newer layout
        pass
    logger.info("DBOS's queue threads not found: they keep polling beside the dequeuer")
    return False
