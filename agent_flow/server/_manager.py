"""`SessionManager`: the sessions the server runs, over the library's public API.

With a `DurableClient` it runs nothing itself: runs are enqueued for durable workers
(`agent_flow.server._remote`), and event streams tail the store.

It creates sessions in the store (their `SessionOptions` kept in the session's metadata, so
a restarted server rebuilds the same agent), builds each session's agent on its first message
with `AgentExecutor.resume` on a bus of the session's own, starts one run at a time per
session, and answers approvals, cancellations and deletions.

Ownership. A live session (its agent, model client, MCP subprocesses, run task) is changed
only inside `SessionManager.owned`, which holds the session's lock: building its agent,
starting a run, deleting it, evicting it and shutting down all go through it, one at a time.
A session closed meanwhile (deleted or evicted) is never handed out again: `owned` loads a
fresh one from the store (or answers 404 once it is deleted). Across processes, the session's
claim in the store (`SessionStore.claim`, taken by the run's `SessionRecorder`) decides.

Eviction. A live session whose last use is `ServerSettings.idle_seconds` old, or the least
recently used beyond `ServerSettings.max_live_sessions`, is closed when idle (never while it
runs); a later request rebuilds it from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agent_flow._defaults import SESSION_LEASE_SECONDS
from agent_flow._eager import start_eagerly, to_the_end
from agent_flow._utils import cancel_and_wait
from agent_flow.agent import AgentExecutor, ExecutionOutcome
from agent_flow.agent._task import resumed_state
from agent_flow.config import AgentConfig
from agent_flow.errors import (
    AgentFlowError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
)
from agent_flow.llm.base import LLMClient
from agent_flow.server._auth import ADMIN, User, audit_log
from agent_flow.server._batching import batched_steps
from agent_flow.server._cancel import answer_call, cancel_run
from agent_flow.server._clients import ModelClients
from agent_flow.server._delete import claim_to_delete
from agent_flow.server._errors import (
    ApiError,
    run_in_progress,
    session_exists,
    session_not_found,
)
from agent_flow.server._live import (
    LiveSession,
    buffering_recorder,
    drive,
    interrupted_end,
    recover,
)
from agent_flow.server._options import session_config
from agent_flow.server._prompts import PromptTap
from agent_flow.server._remote import until_finished
from agent_flow.server.models import CreateSession, SessionOptions
from agent_flow.server.settings import ServerSettings
from agent_flow.sessions.models import SessionInfo, SessionState, event_id
from agent_flow.sessions.protocol import SessionStore
from agent_flow.sessions.recorder import SessionRecorder, claim_session, default_holder
from agent_flow.telemetry.propagation import attached_context
from agent_flow.tools import ApprovalResponse, ToolExecutor

if TYPE_CHECKING:
    from agent_flow.durable import DurableClient, RunHandle

__all__ = ["LLMFactory", "RunStarter", "SessionManager", "ToolsFactory"]

logger = logging.getLogger("agent_flow.server")

#: Builds the model client of a session from its config (default: an `OpenAIClient`).
LLMFactory = Callable[[AgentConfig], LLMClient]
#: Builds the tool executor of a session from its config (default: from the config).
ToolsFactory = Callable[[AgentConfig], ToolExecutor]
#: Starts a run of a session's agent under a run id (`SessionManager.send`).
RunStarter = Callable[[AgentExecutor, str], Coroutine[object, None, ExecutionOutcome]]


class SessionManager:
    """The live sessions of one server (see the module doc)."""

    def __init__(
        self,
        config: AgentConfig,
        store: SessionStore,
        settings: ServerSettings,
        *,
        llm_factory: LLMFactory | None = None,
        tools_factory: ToolsFactory | None = None,
        on_agent: Callable[[AgentExecutor], object] | None = None,
        durable: DurableClient | None = None,
    ) -> None:
        self.config = config
        self._on_agent = on_agent
        self.durable = durable
        if durable is not None and durable.store is None:
            durable.store = store  # a cancelled run's outcome is read there
        self._handles: dict[str, RunHandle] = {}
        self.store = store
        self.settings = settings
        self._llm_factory = llm_factory
        self._tools_factory = tools_factory
        self._live: dict[str, LiveSession] = {}
        self._closers: dict[str, Callable[[], Awaitable[None]]] = {}
        self._loading = asyncio.Lock()
        self._building = threading.Lock()
        #: One SDK client per model endpoint, shared by the sessions (closed at shutdown).
        self.clients = ModelClients()
        self._evicting: asyncio.Task[None] | None = None
        self._closed = False

    def session_config(self, options: SessionOptions) -> AgentConfig:
        """The server's agent config with a session's options applied (422 when invalid)."""
        return session_config(
            self.config, options, self.settings, check_model=self._llm_factory is None
        )

    # -- sessions ------------------------------------------------------------------------

    async def create(self, request: CreateSession, *, owner: str | None = None) -> SessionInfo:
        """Create a session from `request` (its options validated first), owned by `owner`."""
        options = SessionOptions.model_validate(
            request.model_dump(include=set(SessionOptions.model_fields))
        )
        self.session_config(options)
        try:
            info = await self.store.create(
                session_id=request.session_id,
                agent=self.config.name,
                title=request.title,
                metadata={"server_options": options.model_dump(mode="json", exclude_none=True)},
                owner=owner,
            )
        except SessionExistsError:  # the store's insert decides, across processes too
            raise session_exists(request.session_id) from None
        self._live[info.id] = self._new_live(info.id, options, owner)
        return info

    def _new_live(self, session_id: str, options: SessionOptions, owner: str | None) -> LiveSession:
        return LiveSession(
            id=session_id,
            options=options,
            owner=owner,
            store=self.store,
            approval_timeout=self.settings.approval_timeout,
            runs_elsewhere=self.durable is not None,
            last_used=time.monotonic(),
        )

    async def live(self, session_id: str, user: User = ADMIN) -> LiveSession:
        """The loaded session `session_id`, loaded from the store if needed.

        Raises:
            ApiError: 404 when no session has that id, or `user` may not see it (another
                user's session is answered exactly as one that does not exist).
        """
        live = self._live.get(session_id) or await self._load(session_id)
        if not user.may_see(live.owner):
            audit_log("refused", status=404, code="not_owner", user=user.name, session=session_id)
            raise session_not_found(session_id)
        live.last_used = time.monotonic()
        self._start_evicting()
        return live

    @contextlib.asynccontextmanager
    async def owned(self, session_id: str, user: User = ADMIN) -> AsyncIterator[LiveSession]:
        """Hold the live session `session_id`: every change to a live session happens here.

        Raises:
            ApiError: 404 when no session has that id (or it was deleted meanwhile), or
                `user` may not see it; 503 once the server is shutting down.
        """
        while True:
            if self._closed:
                raise ApiError(503, "shutting_down", "the server is shutting down; retry later")
            live = await self.live(session_id, user)
            async with live.lock:
                if live.closed:
                    continue  # evicted or deleted while we waited: load it again (or 404)
                if self._closed:  # (loaded after `aclose` took the sessions it closes)
                    raise ApiError(503, "shutting_down", "the server is shutting down; retry later")
                yield live
                live.last_used = time.monotonic()
                return

    async def _load(self, session_id: str) -> LiveSession:
        async with self._loading:
            live = self._live.get(session_id)
            if live is not None:
                return live
            info = await self.info(session_id)
            stored = info.metadata.get("server_options")
            try:
                options = SessionOptions.model_validate(stored if stored is not None else {})
            except ValidationError:
                options = SessionOptions()
            live = self._new_live(session_id, options, info.owner)
            self._live[session_id] = live
            if info.lease_run is not None and self.durable is None:
                # Left claimed by a process that may have died: end its run if it did. Held
                # meanwhile: a message or a delete waits, not refused for the brief claim.
                async with live.lock:
                    await recover(self.store, live)
            return live

    def loaded(self, session_id: str) -> LiveSession | None:
        """The session if the server has it loaded (None otherwise)."""
        return self._live.get(session_id)

    async def info(self, session_id: str) -> SessionInfo:
        """The stored description of `session_id` (404 when there is none)."""
        try:
            return await self.store.info(session_id)
        except SessionNotFoundError:
            raise session_not_found(session_id) from None

    async def resume(self, session_id: str, user: User = ADMIN) -> AgentExecutor:
        """The session's agent, resumed from the store and started now if it was not."""
        async with self.owned(session_id, user) as live:
            return await self._agent(live)

    async def _agent(self, live: LiveSession) -> AgentExecutor:
        """The session's agent, built on first use; the caller holds the session (`owned`)."""
        if live.agent is not None:
            return live.agent
        if self.durable is not None:
            raise ApiError(
                409,
                "runs_elsewhere",
                "this server enqueues runs for durable workers and runs no agent itself; "
                "send a message (POST /sessions/{id}/messages) and watch its events",
            )
        # What the store holds now is what the agent is built from: a later claim whose fence
        # is not the next one means another process wrote the session since (see `send`).
        state = await self.store.load(live.id)
        # Loaded while a claim holds the session, the agent is behind that claim's run (which
        # may write more; a `send` of this server sets its own claim's fence right after).
        info = state.info
        live.fence = info.lease_fence - 1 if info.lease_run is not None else info.lease_fence
        # Building is CPU work (config validation, the client, the tools, decoding the
        # history): off the event loop, so that other sessions' streams do not wait for it.
        agent, close_llm = await asyncio.to_thread(self._build, live, state)
        if isinstance(agent.recorder, SessionRecorder):
            live.recorder = agent.recorder
            agent.recorder = buffering_recorder(agent.recorder, live)
        try:
            await agent.start()
        except AgentFlowError as err:
            if close_llm is not None:
                await close_llm()
            raise ApiError(422, "agent_not_started", str(err)) from None
        if live.options.skill is not None:
            agent.activate_skill(live.options.skill)
        if self._on_agent is not None:
            self._on_agent(agent)
        if close_llm is not None:
            self._closers[live.id] = close_llm
        live.agent = agent
        return agent

    def _build(
        self, live: LiveSession, state: SessionState
    ) -> tuple[AgentExecutor, Callable[[], Awaitable[None]] | None]:
        """The session's agent from its stored `state`, and how to close its client (a thread).

        One at a time: a `tools_factory` may hand every session one shared `ToolExecutor`,
        which the agent's constructor registers control tools into.
        """
        with self._building:
            return self._build_now(live, state)

    def _build_now(
        self, live: LiveSession, state: SessionState
    ) -> tuple[AgentExecutor, Callable[[], Awaitable[None]] | None]:
        config = self.session_config(live.options)
        close_llm: Callable[[], Awaitable[None]] | None = None
        if self._llm_factory is not None:
            llm = self._llm_factory(config)
        else:
            try:
                client = self.clients.client(config.resolved_llm())
            except AgentFlowError as err:
                raise ApiError(422, "invalid_option", str(err), field="model") from None
            llm, close_llm = client, client.aclose
        tools = self._tools_factory(config) if self._tools_factory is not None else None
        history, environment = resumed_state(state, config)
        # The inspector's view of each step's prompt as sent (bounded; see _prompts).
        tap = PromptTap(llm, live)
        agent = AgentExecutor(
            tap,
            config=config,
            history=history,
            environment=environment,
            store=self.store,
            session_id=live.id,
            tools=tools,
            approval=live.approve,
            bus=live.bus,
        )
        tap.attach(agent.context)
        return agent, close_llm

    async def send(
        self,
        session_id: str,
        message: str,
        *,
        trace: Mapping[str, str] | None = None,
        start: RunStarter | None = None,
    ) -> tuple[str, int]:
        """Start a run of the session on `message`; its run id and its first event's id.

        `trace` is the requester's trace context (`agent_flow.telemetry.propagation`): the
        run, which outlives the request, continues that trace. `start`, when given, starts
        the run instead (`agent_flow.server._agui_route`): called with the session's agent
        and the run id while the session is held and claimed, it may change the agent's
        state first, and raise `ApiError` to start nothing.

        Raises:
            ApiError: 404 for an unknown session, 409 (with its id) while a run is under way.
        """
        async with self.owned(session_id) as live:
            if live.running:
                raise run_in_progress(session_id, live.run_id or "")
            if self.durable is not None:
                return await self._enqueue(live, self.durable, message, trace)
            run_id = uuid.uuid4().hex
            try:
                # The session's claim, in the store, first: one run at a time across every
                # process, and what this server reads next is what the last writer left.
                lease = await claim_session(
                    self.store,
                    session_id,
                    run_id=run_id,
                    holder=default_holder(),
                    ttl=SESSION_LEASE_SECONDS,
                )
            except SessionBusyError as err:
                where = " (in this or another process)"
                raise run_in_progress(session_id, err.run_id, where) from None
            try:
                if not live.current_at(lease.fence):
                    # Another process ran the session since this agent was built: its history
                    # and environment are out of date. Build it again from the store.
                    await self._drop_agent(live)
                agent = await self._agent(live)
                recorder = live.recorder
                assert recorder is not None  # the server's agents always have a store
                recorder.adopt(lease)
                base = event_id(lease.fence, 0)
                ended = await interrupted_end(self.store, live, lease)
                first = len(agent.history) == 0 and agent.environment.task.objective == ""
                coroutine = (
                    start(agent, run_id)
                    if start is not None
                    else agent.run(message, run_id=run_id)
                    if first
                    else agent.send(message, run_id=run_id)
                )
            except BaseException:
                if live.recorder is not None and live.recorder.lease is lease:
                    await live.recorder.release()
                else:
                    await self.store.release(lease)
                raise
            live.bases[run_id] = base
            live.buffer = ended
            live.run_id = run_id
            try:  # (a watcher behind may hold a publish: a cancel there must not keep the claim)
                for _, event in ended:
                    await live.bus.publish(event)
            except BaseException:
                coroutine.close()
                await recorder.release()
                raise
            # Only now: a send that failed above leaves the agent behind its claim, for the next
            # run to build again (without what `start` wrote for a run that never ran).
            live.fence = lease.fence
            live.task = asyncio.create_task(batched_steps(drive(session_id, coroutine, trace)))
            # (A task cancelled before its first step never started the run: let it go.)
            live.task.add_done_callback(lambda _: coroutine.close())
        return run_id, base

    async def _enqueue(
        self,
        live: LiveSession,
        durable: DurableClient,
        message: str,
        trace: Mapping[str, str] | None,
    ) -> tuple[str, int]:
        config = self.session_config(live.options)
        info = await self.info(live.id)
        if info.lease_run is not None:
            # Claimed in the store by a run this server does not follow (a worker's, or
            # another server's): answered as a run of its own would be.
            raise run_in_progress(live.id, info.lease_run, " (in another process)")
        # The queued run carries the requester's trace to the worker that executes it.
        with attached_context(trace):
            handle = await durable.enqueue(live.id, message, config=config, run_id=uuid.uuid4().hex)
        self._handles[live.id] = handle
        live.run_id = handle.run_id
        live.task = asyncio.create_task(
            drive(live.id, until_finished(self.store, handle, info.event_count)),
            name=f"agent_flow.durable_run:{handle.run_id}",
        )
        # Its worker claims the session with a fence above every earlier run's: each of its
        # event ids is above every id stored now.
        return handle.run_id, info.last_event_id + 1

    async def cancel(self, session_id: str) -> str:
        """Cancel the session's run and return its id (409 when none runs; `cancel_run`)."""
        return await cancel_run(self, await self.live(session_id))

    async def answer(self, session_id: str, call_id: str, response: ApprovalResponse) -> None:
        """Answer the approval `call_id` waits for (409 when it waits for none; `answer_call`)."""
        await answer_call(self, await self.live(session_id), call_id, response)

    async def delete(self, session_id: str, user: User = ADMIN) -> None:
        """Stop the session's run, release its agent, and delete it from the store.

        A run of this server is stopped first. A run of another process (a server of the
        fleet, a durable worker) is not pulled from under it: 409 ``run_in_progress`` while it
        holds the session's claim (`claim_to_delete`, held while the session is deleted).
        """
        async with self.owned(session_id, user) as live:
            stopped = live.running
            handle = self._handles.get(session_id)
            if stopped:
                await (handle.cancel() if handle is not None else self._stop_run(live))
            elif self.durable is not None and await self.durable.cancel_unfinished(session_id):
                stopped = True  # durable runs another server enqueued: DBOS cancelled them
            # A 409 here leaves the session as it was: its watchers keep watching.
            claim = await claim_to_delete(
                self.store,
                session_id,
                ours=live.run_id,
                stopped=stopped,
                ran_here=self.durable is None,
            )
            try:
                if claim is not None:  # deleted first: the claim is held no longer than that
                    await self.store.delete(session_id)
            except SessionNotFoundError:
                pass
            except BaseException:  # (not deleted: the session stays loaded here, as it was)
                if claim is not None:
                    with contextlib.suppress(StoreError):
                        await to_the_end(start_eagerly(self.store.release(claim)))
                raise
            try:
                await self._close(live)
            except Exception:  # (deleted: the answer says so; the close's failure is logged)
                logger.exception("closing deleted session %s failed", session_id)

    async def _close(self, live: LiveSession) -> None:
        """Release `live` and forget it; the caller holds it (`owned`, or the shutdown)."""
        live.closed = True
        if self._live.get(live.id) is live:
            del self._live[live.id]
        await self._release(live)

    # -- eviction ------------------------------------------------------------------------

    def _start_evicting(self) -> None:
        if self._evicting is None and not self._closed:
            self._evicting = asyncio.get_running_loop().create_task(
                self._evict_forever(), name="agent_flow.server.evict"
            )

    async def _evict_forever(self) -> None:
        every = max(0.05, min(self.settings.idle_seconds / 4, 30.0))
        while True:
            await asyncio.sleep(every)
            try:
                await self.evict()
            except Exception:
                logger.exception("evicting idle sessions failed")

    async def evict(self, *, now: float | None = None) -> list[str]:
        """Close the idle sessions that are too old or too many; return their ids.

        A session is evicted when it is idle (no run, no approval waiting, nobody holding it)
        and either unused for `ServerSettings.idle_seconds` or beyond the
        `ServerSettings.max_live_sessions` most recently used ones. A later request loads it
        again from the store.
        """
        now = time.monotonic() if now is None else now
        by_use = sorted(self._live.values(), key=lambda live: live.last_used, reverse=True)
        excess = max(0, len(by_use) - self.settings.max_live_sessions)
        candidates = [
            live
            for rank, live in enumerate(by_use)
            if now - live.last_used >= self.settings.idle_seconds or rank >= len(by_use) - excess
        ]
        evicted: list[str] = []
        for live in candidates:
            if live.running or live.approvals or live.lock.locked():
                continue
            async with live.lock:
                if live.closed or live.running or live.approvals:
                    continue
                await self._close(live)
                evicted.append(live.id)
        return evicted

    async def _release(self, live: LiveSession) -> None:
        self._handles.pop(live.id, None)  # a durable run goes on in its worker
        try:
            await self._stop_run(live)
        finally:  # (a caller cancelled meanwhile still closes the agent and the streams)
            try:
                await self._drop_agent(live)
            finally:
                live.bus.close()

    async def _stop_run(self, live: LiveSession) -> None:
        """Cancel the session's run in this server and wait for its end (its claim given back)."""
        task = live.task
        if task is not None and not task.done():
            if live.agent is not None:
                live.agent.cancel()
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)

    async def _drop_agent(self, live: LiveSession) -> None:
        """Close the session's agent (its MCP servers, its model client); keep the session."""
        if live.agent is not None:
            try:
                await live.agent.aclose()
            finally:
                live.agent = None
                live.recorder = None
                closer = self._closers.pop(live.id, None)
                if closer is not None:
                    await closer()

    async def aclose(self) -> None:
        """Stop every run and release every agent and client (the store is the caller's)."""
        self._closed = True
        # A cancellation meanwhile is held until everything is closed, then raised.
        cancelled: asyncio.CancelledError | None = None
        try:
            if self._evicting is not None:
                await cancel_and_wait(self._evicting)
        except asyncio.CancelledError as err:
            cancelled = err
        lives, self._live = list(self._live.values()), {}
        for live in lives:
            while True:
                try:
                    async with live.lock:
                        live.closed = True
                        await self._release(live)
                    break
                except asyncio.CancelledError as err:  # (then this session once more)
                    cancelled = err
                except Exception:
                    logger.exception("releasing session %s failed", live.id)
                    break
        try:
            await self.clients.aclose()
        finally:
            if cancelled is not None:
                raise cancelled
