"""Runs a server hands to durable workers: enqueue, follow to the end, cancel.

With a `DurableClient` (``[durable] enabled = true``), `SessionManager.send` does not run the
agent in the server: it enqueues the run on the DBOS queue and answers at once; a worker
process executes it (`agent_flow.durable`). The server learns how the run goes from the store
(its events, saved by the worker step by step, `SessionStore.follow_events`) and, for a run
that died without finishing, from DBOS (`RunHandle.state`).

Without durable workers, a session's run may be another server's: `claimed_by` names it, for
the refusals that say where it runs, once `held_elsewhere` has ended the claim of a process of
this machine that died.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent_flow._defaults import DURABLE_STATE_SECONDS
from agent_flow.errors import StoreError
from agent_flow.events import RunFinished
from agent_flow.server._live import LiveSession, brief_claim, recover
from agent_flow.sessions.protocol import SessionStore

if TYPE_CHECKING:
    from agent_flow.durable import RunHandle

__all__ = ["claimed_by", "held_elsewhere", "until_finished"]

logger = logging.getLogger("agent_flow.server")


async def claimed_by(store: SessionStore, session_id: str) -> str | None:
    """The run that holds the session's claim in the store (a run of any process), if any.

    None too for a server's brief claims (one ending a dead run, or deleting the session),
    and when the store cannot say: a hint, for a refusal that stands without it.
    """
    try:
        run = (await store.info(session_id)).lease_run
    except StoreError:
        return None
    return None if run is None or brief_claim(run) else run


async def held_elsewhere(
    store: SessionStore, live: LiveSession, run: str | None, *, durable: bool
) -> str | None:
    """The run holding the session, `run` as `claimed_by` read it, once a dead one is ended.

    A server killed mid-run holds its session's claim until it expires
    (`SESSION_LEASE_SECONDS`). A cancel or an approval's answer sent meanwhile to another
    server must not be told to go to a run that no process runs: the dead run is ended here as
    loading the session would (`recover`: its watchers get its ``interrupted`` end), and the
    claim read again. A live holder, or one of another machine, keeps its claim. With durable
    workers (`durable`), a dead worker's run is DBOS's to recover, and its claim is left alone.
    """
    if run is None or durable:
        return run
    try:
        async with live.lock:
            if not live.closed and not live.running:  # (a run of this server: the caller's)
                await recover(store, live)
    except StoreError:
        return run  # (a hint: the refusal stands without a better one)
    return await claimed_by(store, live.id)


async def until_finished(store: SessionStore, handle: RunHandle, offset: int) -> None:
    """Return when the run of `handle` is over: its `RunFinished` is stored, or DBOS says so.

    Args:
        store: The store the run's worker saves into.
        handle: The enqueued run.
        offset: The session's event count when it was enqueued (its events come after).
    """
    while True:
        events = await store.wait_for_events(
            handle.session_id, offset=offset, wait=DURABLE_STATE_SECONDS
        )
        offset += len(events)
        if any(isinstance(e, RunFinished) and e.run_id == handle.run_id for e in events):
            return
        if not events:
            state = await handle.state()
            if state in ("succeeded", "failed", "cancelled"):
                if state != "succeeded":
                    logger.warning("durable run %s ended %s", handle.run_id, state)
                return
