"""`DurableClient`: enqueue durable runs and await or poll their outcomes, from any process.

A client talks to DBOS's system database (`dbos.DBOSClient`): a server or a script
enqueues runs without executing any; `DurableWorker` processes execute them. Given the
workers' session store too, a client answers with the run's own record where DBOS's status
cannot tell the whole truth (see `RunHandle.outcome`).
"""

from __future__ import annotations

import asyncio
import uuid
from types import TracebackType
from typing import Any, Literal, Self

from dbos import DBOS, DBOSClient
from dbos import error as dbos_error

from agent_flow._defaults import DURABLE_CANCEL_SETTLE_SECONDS
from agent_flow.agent import ExecutionOutcome, StopReason
from agent_flow.config import AgentConfig
from agent_flow.durable._wake import Notifier, wake_payload
from agent_flow.durable._workflow import OUTCOME_CHECKPOINT, WORKFLOW_NAME, RunRequest
from agent_flow.durable.config import DurableConfig, app_version, libpq_url
from agent_flow.errors import RunError
from agent_flow.sessions.models import Checkpoint
from agent_flow.sessions.protocol import SessionStore
from agent_flow.telemetry.propagation import inject_context

__all__ = ["DurableClient", "RunHandle", "RunState"]

#: Where a run is: queued, executing (or waiting for recovery), or over.
RunState = Literal["queued", "running", "succeeded", "failed", "cancelled"]

_STATES: dict[str, RunState] = {
    "ENQUEUED": "queued",
    "DELAYED": "queued",
    "PENDING": "running",
    "SUCCESS": "succeeded",
    "ERROR": "failed",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "failed",
    "CANCELLED": "cancelled",
}


class RunHandle:
    """One enqueued run: its id, its state, its outcome."""

    def __init__(
        self,
        client: DBOSClient,
        run_id: str,
        session_id: str,
        store: SessionStore | None = None,
    ) -> None:
        self._client = client
        self._store = store
        self.run_id = run_id
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"RunHandle(run_id={self.run_id!r}, session_id={self.session_id!r})"

    async def state(self) -> RunState:
        """Where the run is now.

        For a cancelled run, with the session store: ``running`` while its execution is
        still stopping (it started, and its end is not stored yet), then what its stored
        outcome says (``succeeded`` when the cancel came after its last step).
        """
        handle: Any = await self._client.retrieve_workflow_async(self.run_id)
        state = _STATES.get((await handle.get_status()).status, "running")
        if state == "cancelled" and self._store is not None:
            records = await self._store.checkpoints(self.session_id, self.run_id)
            stored = _outcome_in(records)
            if stored is None:
                return "running" if records else "cancelled"
            return "cancelled" if stored.stop_reason == StopReason.CANCELLED else "succeeded"
        return state

    async def cancel(self) -> None:
        """Cancel the run: it stops at a model or tool call within about half a second.

        A running run reads the cancellation every `DURABLE_CANCEL_CHECK_SECONDS`; a call
        under way finishes first. It then ends as cancelled runs do: ``run_finished`` with
        `StopReason.CANCELLED` is stored, and so is its outcome. A run still queued never
        starts. Cancelling a run that is over changes nothing; one whose last step was under
        way still ends as it would have (its stored outcome says so, and `outcome` returns it).
        """
        await self._client.cancel_workflow_async(self.run_id)

    async def outcome(self, *, poll_seconds: float = 0.1) -> ExecutionOutcome:
        """Wait for the run to end and return its outcome (the run's own, however it stopped).

        For a cancelled run, the outcome its execution stored (`StopReason.CANCELLED`, or the
        run's own end where the cancel came after its last step) when the client was given
        the session store; DBOS keeps no result for a cancelled workflow.

        Raises:
            RunError: The workflow itself failed (not the agent: its failures are outcomes),
                or it was cancelled and no outcome is known (cancelled while queued, or the
                client has no session store).
        """
        handle: Any = await self._client.retrieve_workflow_async(self.run_id)
        try:
            raw = await handle.get_result(polling_interval_sec=poll_seconds)
        except asyncio.CancelledError:
            raise
        except dbos_error.DBOSAwaitedWorkflowCancelledError as err:
            stored = await self._stopped_outcome(poll_seconds)
            if stored is not None:
                return stored
            raise RunError(
                f"durable run {self.run_id} was cancelled"
                + ("" if self._store is not None else " (its outcome is in the session store)")
            ) from err
        except Exception as err:
            raise RunError(f"durable run {self.run_id} failed: {err}") from err
        return ExecutionOutcome.model_validate_json(raw)

    async def _stopped_outcome(self, poll_seconds: float) -> ExecutionOutcome | None:
        """The outcome a cancelled run stores once its execution stopped.

        None when it never started, or the client has no store. DBOS says "cancelled" at
        once; the execution stops at its next model or tool call, waited for up to
        `DURABLE_CANCEL_SETTLE_SECONDS`.
        """
        if self._store is None:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DURABLE_CANCEL_SETTLE_SECONDS
        while True:
            records = await self._store.checkpoints(self.session_id, self.run_id)
            stored = _outcome_in(records)
            if stored is not None:
                return stored
            if not records or loop.time() >= deadline:
                # Cancelled while queued (it never started), or it did not stop in time.
                return None
            await asyncio.sleep(poll_seconds)


def _outcome_in(records: list[Checkpoint]) -> ExecutionOutcome | None:
    """The outcome a run stored as its last checkpoint, if it ended."""
    if records and records[-1].name == OUTCOME_CHECKPOINT:
        return ExecutionOutcome.model_validate_json(records[-1].result)
    return None


class DurableClient:
    """Enqueues runs on the deployment's DBOS queue (use as ``async with``, or `close`).

    Creating one connects to the system database and creates DBOS's tables if they are
    missing (blocking, once per process start); start it before the workers.

    Args:
        durable: The deployment's durable settings.
        store: The workers' session store (optional; the caller opens and closes it): the
            outcome of a cancelled run is read there.
    """

    def __init__(self, durable: DurableConfig, store: SessionStore | None = None) -> None:
        self.durable = durable
        self.store = store
        # Runs may be enqueued before any worker started: create DBOS's tables if needed.
        DBOS.migrate(durable.resolved_url())
        self._client = DBOSClient(
            system_database_url=durable.resolved_url(), application_name=durable.app_name
        )
        # On PostgreSQL the workers are told of each run enqueued (`_wake`).
        url = libpq_url(durable.resolved_url())
        self._notifier = (
            Notifier(url, wake_payload(durable.app_name, durable.queue)) if url else None
        )

    async def enqueue(
        self,
        session_id: str,
        message: str,
        *,
        config: AgentConfig | None = None,
        run_id: str | None = None,
    ) -> RunHandle:
        """Enqueue a run of `session_id` on `message` and return its handle.

        Args:
            session_id: A session that exists in the workers' store.
            message: The user message the run starts with.
            config: The agent config to run with (None: the worker's own).
            run_id: The run's id (a new one if None); enqueueing an id again is a no-op.
        """
        request = RunRequest(
            session_id=session_id,
            message=message,
            run_id=run_id or uuid.uuid4().hex,
            config=config.model_dump(mode="json", exclude_unset=True) if config else None,
            trace_context=inject_context() or None,
        )
        options: Any = {
            "workflow_name": WORKFLOW_NAME,
            "queue_name": self.durable.queue,
            "workflow_id": request.run_id,
            "app_version": app_version(),
            # The queue is partitioned by session: its runs execute one at a time.
            "queue_partition_key": session_id,
        }
        await self._client.enqueue_async(options, request.model_dump_json())
        if self._notifier is not None:
            await self._notifier.notify()
        return RunHandle(self._client, request.run_id, session_id, self.store)

    async def cancel_unfinished(self, session_id: str) -> list[str]:
        """Cancel the session's `unfinished` runs; return their ids, oldest first."""
        runs = await self.unfinished(session_id)
        for run in runs:
            await run.cancel()
        return [run.run_id for run in runs]

    async def unfinished(self, session_id: str) -> list[RunHandle]:
        """The session's runs DBOS has not finished, queued or under way, oldest first.

        Whoever enqueued them: DBOS's queue is the fleet's.
        """
        found: list[Any] = await self._client.list_queued_workflows_async(
            queue_name=self.durable.queue,
            name=WORKFLOW_NAME,
            load_input=False,
            load_output=False,
        )
        return [
            RunHandle(self._client, status.workflow_id, session_id, self.store)
            for status in found
            if status.queue_partition_key == session_id
        ]

    def handle(self, run_id: str, session_id: str) -> RunHandle:
        """The handle of a run enqueued earlier (by any process)."""
        return RunHandle(self._client, run_id, session_id, self.store)

    def close(self) -> None:
        """Release the client's connections to the system database."""
        self._client.destroy()
        if self._notifier is not None:
            self._notifier.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
