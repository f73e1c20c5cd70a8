"""The claim a server takes on a session to delete it (`SessionManager.delete`).

A session is deleted only while this server holds its claim: no run of another process (a
server of the fleet, a durable worker) is pulled from under it, and none starts while the
rows go. The claim dies with the session; a delete that fails gives it back.
"""

from __future__ import annotations

import asyncio
import uuid

from agent_flow._defaults import SESSION_DELETE_WAIT_SECONDS, SESSION_LEASE_SECONDS
from agent_flow.errors import SessionBusyError, SessionNotFoundError
from agent_flow.server._errors import run_in_progress
from agent_flow.server._live import DELETE_CLAIM, brief_claim
from agent_flow.sessions.models import Lease
from agent_flow.sessions.protocol import SessionStore
from agent_flow.sessions.recorder import claim_session, default_holder, end_claim

__all__ = ["claim_to_delete"]


async def claim_to_delete(
    store: SessionStore,
    session_id: str,
    *,
    ours: str | None,
    stopped: bool,
    ran_here: bool,
) -> Lease | None:
    """Claim the session so as to delete it; None when it is gone already.

    Args:
        store: The session store.
        session_id: The session.
        ours: The last run this server ran or enqueued of the session, over now. Its claim,
            when this process holds it still (its release failed) and `ran_here`, is ended,
            not waited out; when a durable worker does (it stores the run's outcome after its
            end; it may be a worker in this very process), it is waited for, as after
            `stopped`. Brief claims of other servers (one ending a dead run as it loads the
            session, or deleting it) are waited for too.
        stopped: This server has just cancelled the session's run: a claim still held is
            tried again for up to `SESSION_DELETE_WAIT_SECONDS` (a durable worker gives it
            back a moment after the cancel).
        ran_here: This server ran `ours` itself (no durable worker did).

    Raises:
        ApiError: 409 ``run_in_progress`` naming the run that holds the session.
    """
    holder = default_holder()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SESSION_DELETE_WAIT_SECONDS
    pause = 0.05
    while True:
        try:
            return await claim_session(
                store,
                session_id,
                run_id=f"{DELETE_CLAIM}{uuid.uuid4().hex}",
                holder=holder,
                ttl=SESSION_LEASE_SECONDS,
            )
        except SessionNotFoundError:
            return None
        except SessionBusyError as err:
            mine = ours is not None and err.run_id == ours
            if mine and ran_here and err.holder == holder and err.fence:
                await end_claim(store, session_id, err)
                ours = None  # once: a claim renewed since is a live run's
                continue
            if not (stopped or mine or brief_claim(err.run_id)) or loop.time() >= deadline:
                where = " in this process" if err.holder == holder else " in another process"
                raise run_in_progress(session_id, err.run_id, where) from None
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)
