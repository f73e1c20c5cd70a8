"""Claiming a session for a run: `claim_session`, and ending the claim of a dead process.

`SessionStore.claim` is the store's; this is what every run of this package does around it:
a claim held by a process of this machine that is gone is ended at once (`end_claim`) rather
than waited out, a claim made for a caller cancelled meanwhile is given back, and so is one
that a failed claim may have stored all the same. `default_holder` names this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from datetime import UTC, datetime

from agent_flow._eager import start_eagerly, to_the_end
from agent_flow.errors import LeaseLostError, SessionBusyError, SessionNotFoundError, StoreError
from agent_flow.sessions.models import Lease
from agent_flow.sessions.protocol import SessionStore

__all__ = ["claim_session", "default_holder", "end_claim"]


def default_holder() -> str:
    """Who this process is, in a lease: ``pid@host``, and ``:pidns`` where there is one.

    The PID namespace (Linux: the inode of ``/proc/self/ns/pid``) tells processes apart that
    share a host name but not their process ids (containers on the host's network, or given
    one host name): a process id is looked up only in the namespace it belongs to.
    """
    holder = f"{os.getpid()}@{socket.gethostname()}"
    return f"{holder}:{_PID_NAMESPACE}" if _PID_NAMESPACE else holder


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


_PID_NAMESPACE = _pid_namespace()


async def claim_session(
    store: SessionStore,
    session_id: str,
    *,
    run_id: str,
    holder: str,
    ttl: float,
    unique_run: bool = True,
) -> Lease:
    """`SessionStore.claim`, ending at once a claim held by a dead process of this machine.

    A process of this machine that is gone (killed, crashed) holds its claim until it
    expires; a restarted server need not wait for that: the claim is ended now (as it would
    expire: the dead run gets its ``interrupted`` end) and the session claimed.

    A caller cancelled while the claim is under way gets its `CancelledError` once the claim
    has ended, never a claim left behind: one made meanwhile is released first (nothing will
    run under it; kept, it would refuse every other run until it expired).

    A claim that failed without saying why (a connection lost at its commit) may have been
    stored all the same: if the session's claim is `run_id`'s, it is given back, so that it
    does not refuse the next run until it expires; but not with ``unique_run=False`` (a
    durable run's executions share its id: the claim found may be another execution's).

    Raises:
        SessionBusyError: A live process (or one of another machine) holds the session.
    """
    claiming = start_eagerly(_claim(store, session_id, run_id=run_id, holder=holder, ttl=ttl))
    try:
        return await to_the_end(claiming)
    except asyncio.CancelledError:
        failure = None if claiming.cancelled() else claiming.exception()
        with contextlib.suppress(StoreError):
            if failure is None and not claiming.cancelled():
                await to_the_end(start_eagerly(store.release(claiming.result())))
            elif _unsure(failure) and unique_run:
                await to_the_end(start_eagerly(_give_back(store, session_id, run_id, holder)))
        raise
    except StoreError as err:
        if _unsure(err) and unique_run:
            with contextlib.suppress(StoreError):
                await to_the_end(start_eagerly(_give_back(store, session_id, run_id, holder)))
        raise


def _unsure(failure: BaseException | None) -> bool:
    """Whether a claim that failed with `failure` may have been stored all the same."""
    return isinstance(failure, StoreError) and not isinstance(
        failure, (SessionBusyError, SessionNotFoundError)
    )


async def _give_back(store: SessionStore, session_id: str, run_id: str, holder: str) -> None:
    """Release the session's claim if it is `run_id`'s (made by a claim that reported failure)."""
    info = await store.info(session_id)
    if info.lease_run != run_id:
        return
    await store.release(
        Lease(
            session_id=session_id,
            run_id=run_id,
            holder=holder,
            fence=info.lease_fence,
            expires_at=datetime.now(UTC),  # (a release goes by the run and the fence)
        )
    )


async def _claim(
    store: SessionStore, session_id: str, *, run_id: str, holder: str, ttl: float
) -> Lease:
    try:
        return await store.claim(session_id, run_id=run_id, holder=holder, ttl=ttl)
    except SessionBusyError as err:
        if not _dead_here(err.holder) or not err.fence:
            raise
        await end_claim(store, session_id, err)
        return await store.claim(session_id, run_id=run_id, holder=holder, ttl=ttl)


async def end_claim(store: SessionStore, session_id: str, busy: SessionBusyError) -> None:
    """Make the claim `busy` names expire now: only for a holder known to be gone.

    Its run can no longer write (the next claim takes another fence) and, if it never ended,
    gets its ``interrupted`` end from that claim. A claim renewed or taken since is left alone.
    """
    stale = Lease(
        session_id=session_id,
        run_id=busy.run_id,
        holder=busy.holder,
        fence=busy.fence,
        expires_at=datetime.now(UTC),
    )
    with contextlib.suppress(LeaseLostError):
        await store.renew(stale, ttl=0)


def _dead_here(holder: str) -> bool:
    """Whether `holder` (``pid@host[:pidns]``) names a gone process of this PID namespace.

    A holder without a namespace (written before there was one) is judged by its host alone.
    """
    pid, _, where = holder.partition("@")
    host, _, namespace = where.partition(":")
    if namespace and namespace != _PID_NAMESPACE:
        return False  # its process ids are not ours to look up
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False
