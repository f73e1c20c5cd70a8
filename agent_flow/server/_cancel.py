"""Cancelling a session's run and answering its approvals, wherever the run is.

A run of this server is cancelled (or its call answered) here. A durable run is cancelled
through DBOS, whichever server enqueued it (DBOS is the fleet's). A run another server of the
fleet runs can be reached only there: the answer is 409 naming it, unless its process was one
of this machine and died, whose run is ended here (`held_elsewhere`) and no run is named. A run
of this server whose claim the request read as it started is cancelled (or answered) like any
run of this server, never named as another process's; one started after that read is not
touched (a "stop" that found nothing must not stop the next turn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_flow.server._errors import not_running, not_waiting
from agent_flow.server._live import LiveSession
from agent_flow.server._remote import claimed_by, held_elsewhere
from agent_flow.tools import ApprovalResponse

if TYPE_CHECKING:
    from agent_flow.server._manager import SessionManager

__all__ = ["answer_call", "cancel_run"]


async def cancel_run(manager: SessionManager, live: LiveSession) -> str:
    """Cancel `live`'s run and return its id.

    Raises:
        ApiError: 409 ``not_running`` when no run of it runs (naming one of another process).
    """
    if (run := await _cancel_here(manager, live)) is not None:
        return run
    if manager.durable is not None and (runs := await manager.durable.cancel_unfinished(live.id)):
        return runs[0]
    claim, elsewhere = await _elsewhere(manager, live)
    # The claim read was this server's run, starting meanwhile: it is cancelled, not named (a
    # run started after the read is not: the cancel did not find it).
    if claim is not None and claim == live.run_id and (run := await _cancel_here(manager, live)):
        return run
    raise not_running(live.id, None if elsewhere == live.run_id else elsewhere)


async def answer_call(
    manager: SessionManager, live: LiveSession, call_id: str, response: ApprovalResponse
) -> None:
    """Answer the approval the call `call_id` waits for.

    Raises:
        ApiError: 409 ``not_waiting`` when it waits for none here (naming the run of another
            process that holds the session, whose approvals wait there).
    """
    if live.answer(call_id, response):
        return
    if live.running:
        raise not_waiting(live.id, call_id, None)
    claim, elsewhere = await _elsewhere(manager, live)
    # (This server's run, starting as the claim was read: its approvals are here.)
    if claim is not None and claim == live.run_id and live.answer(call_id, response):
        return
    raise not_waiting(live.id, call_id, None if elsewhere == live.run_id else elsewhere)


async def _cancel_here(manager: SessionManager, live: LiveSession) -> str | None:
    """Cancel this server's run of `live` and return its id (None: it runs none)."""
    handle = manager._handles.get(live.id)
    if handle is not None and live.running:
        await handle.cancel()
        return handle.run_id
    if live.running and live.agent is not None and live.run_id is not None:
        live.agent.cancel()
        return live.run_id
    if live.running:
        raise not_running(live.id, None)
    return None


async def _elsewhere(manager: SessionManager, live: LiveSession) -> tuple[str | None, str | None]:
    """The session's claim as first read, and the run holding it once a dead one is ended."""
    claim = await claimed_by(manager.store, live.id)
    durable = manager.durable is not None
    return claim, await held_elsewhere(manager.store, live, claim, durable=durable)
