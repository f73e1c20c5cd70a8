"""`SessionManager`: the sessions the server runs, over the library's public API.

With a `DurableClient` it runs nothing itself: runs are enqueued for durable workers
(`agent_flow.server._remote`), and event streams tail the store.

It creates sessions in the store (their `SessionOptions` kept in the session's metadata, so
a restarted server rebuilds the same agent), builds each session's agent on its first message
with `AgentExecutor.resume` on a bus of the session's own, starts one run at a time per
session, and answers approvals, cancellations and deletions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig
from agent_flow.errors import AgentFlowError, SessionNotFoundError
from agent_flow.llm.base import LLMClient
from agent_flow.server._live import LiveSession, buffering_recorder
from agent_flow.server._remote import until_finished
from agent_flow.server.models import CreateSession, SessionOptions
from agent_flow.server.settings import ServerSettings
from agent_flow.sessions.models import SessionInfo
from agent_flow.sessions.protocol import SessionStore
from agent_flow.telemetry.propagation import attached_context
from agent_flow.tools import ApprovalResponse, ToolExecutor

if TYPE_CHECKING:
    from agent_flow.durable import DurableClient, RunHandle

__all__ = ["ApiError", "LLMFactory", "SessionManager", "ToolsFactory"]

logger = logging.getLogger("agent_flow.server")

#: Builds the model client of a session from its config (default: an `OpenAIClient`).
LLMFactory = Callable[[AgentConfig], LLMClient]
#: Builds the tool executor of a session from its config (default: from the config).
ToolsFactory = Callable[[AgentConfig], ToolExecutor]


class ApiError(Exception):
    """A client's mistake, answered with `status` and an `ErrorBody`."""

    def __init__(
        self, status: int, code: str, message: str, *, field: str = "", run_id: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field or None
        self.run_id = run_id or None

    def __reduce__(self) -> tuple[object, ...]:
        # The default rebuilds from ``args`` (the message alone) and would lose the rest.
        return (
            _rebuild_api_error,
            (self.status, self.code, self.message, self.field or "", self.run_id or ""),
        )


def _rebuild_api_error(status: int, code: str, message: str, field: str, run_id: str) -> ApiError:
    return ApiError(status, code, message, field=field, run_id=run_id)


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
        self._handles: dict[str, RunHandle] = {}
        self.store = store
        self.settings = settings
        self._llm_factory = llm_factory
        self._tools_factory = tools_factory
        self._live: dict[str, LiveSession] = {}
        self._closers: dict[str, Callable[[], Awaitable[None]]] = {}
        self._loading = asyncio.Lock()

    # -- configuration -------------------------------------------------------------------

    def session_config(self, options: SessionOptions) -> AgentConfig:
        """The server's agent config with a session's options applied.

        Raises:
            ApiError: 422 naming the option that is invalid.
        """
        data = self.config.model_dump(mode="json", exclude_unset=True)
        if options.model is not None or options.base_url is not None:
            overrides = dict(data.get("llm_overrides") or {})
            if options.model is not None:
                overrides["model"] = options.model
            if options.base_url is not None:
                if not options.base_url.startswith(("http://", "https://")):
                    raise ApiError(
                        422,
                        "invalid_option",
                        f"base_url {options.base_url!r} is not an http(s) URL",
                        field="base_url",
                    )
                overrides["base_url"] = options.base_url
            data["llm_overrides"] = overrides
        if options.workspace is not None:
            data["workspace"] = str(self._workspace(options.workspace))
        if options.max_tokens is not None:
            data["context"] = {**dict(data.get("context") or {}), "max_tokens": options.max_tokens}
        try:
            config = AgentConfig.model_validate(data)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ApiError(
                422, "invalid_config", f"the session's config is invalid at {where}: {first['msg']}"
            ) from None
        if options.skill is not None:
            try:
                config.skill(options.skill)
            except AgentFlowError as err:
                raise ApiError(422, "invalid_option", str(err), field="skill") from None
        if self._llm_factory is None:
            try:
                config.resolved_llm()
            except AgentFlowError as err:
                raise ApiError(422, "invalid_option", str(err), field="model") from None
        return config

    def _workspace(self, requested: str) -> Path:
        roots = [root.resolve() for root in self.settings.workspace_roots]
        if not roots:
            raise ApiError(
                422,
                "workspace_not_allowed",
                "this server has no workspace roots, so a session cannot choose a workspace; "
                "start it with --workspace-root DIR",
                field="workspace",
            )
        try:
            path = Path(requested).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):
            path = None
        if path is None or not any(path == root or path.is_relative_to(root) for root in roots):
            raise ApiError(
                422,
                "workspace_not_allowed",
                f"workspace {requested!r} is not under an allowed root "
                f"({', '.join(str(root) for root in roots)})",
                field="workspace",
            )
        if not path.is_dir():
            raise ApiError(
                422,
                "workspace_not_allowed",
                f"workspace {requested!r} is not a directory",
                field="workspace",
            )
        return path

    # -- sessions ------------------------------------------------------------------------

    async def create(self, request: CreateSession) -> SessionInfo:
        """Create a session from `request` (its options validated first)."""
        options = SessionOptions.model_validate(
            request.model_dump(include=set(SessionOptions.model_fields))
        )
        self.session_config(options)
        if request.session_id is not None:
            with contextlib.suppress(SessionNotFoundError):
                await self.store.info(request.session_id)
                raise ApiError(
                    409,
                    "session_exists",
                    f"session {request.session_id!r} exists; choose another id or omit it",
                    field="session_id",
                )
        info = await self.store.create(
            session_id=request.session_id,
            agent=self.config.name,
            title=request.title,
            metadata={"server_options": options.model_dump(mode="json", exclude_none=True)},
        )
        self._live[info.id] = self._new_live(info.id, options)
        return info

    def _new_live(self, session_id: str, options: SessionOptions) -> LiveSession:
        return LiveSession(
            id=session_id,
            options=options,
            store=self.store,
            approval_timeout=self.settings.approval_timeout,
            runs_elsewhere=self.durable is not None,
        )

    async def live(self, session_id: str) -> LiveSession:
        """The loaded session `session_id`, loaded from the store if needed.

        Raises:
            ApiError: 404 when no session has that id.
        """
        live = self._live.get(session_id)
        if live is not None:
            return live
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
            live = self._live[session_id] = self._new_live(session_id, options)
            return live

    def loaded(self, session_id: str) -> LiveSession | None:
        """The session if the server has it loaded (None otherwise)."""
        return self._live.get(session_id)

    async def info(self, session_id: str) -> SessionInfo:
        """The stored description of `session_id` (404 when there is none)."""
        try:
            return await self.store.info(session_id)
        except SessionNotFoundError:
            raise ApiError(
                404, "not_found", f"no session has the id {session_id!r}", field="session_id"
            ) from None

    async def agent(self, live: LiveSession) -> AgentExecutor:
        """The session's agent, resumed from the store and started on first use."""
        if live.agent is not None:
            return live.agent
        if self.durable is not None:
            raise ApiError(
                409,
                "runs_elsewhere",
                "this server enqueues runs for durable workers and runs no agent itself; "
                "send a message (POST /sessions/{id}/messages) and watch its events",
            )
        config = self.session_config(live.options)
        close_llm: Callable[[], Awaitable[None]] | None = None
        if self._llm_factory is not None:
            llm = self._llm_factory(config)
        else:
            from agent_flow.llm.openai_client import OpenAIClient

            try:
                client = OpenAIClient.from_config(config.resolved_llm())
            except AgentFlowError as err:
                raise ApiError(422, "invalid_option", str(err), field="model") from None
            llm, close_llm = client, client.aclose
        tools = self._tools_factory(config) if self._tools_factory is not None else None
        agent = await AgentExecutor.resume(
            self.store,
            live.id,
            llm,
            config=config,
            tools=tools,
            approval=live.approve,
            bus=live.bus,
        )
        if agent.recorder is not None:
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

    async def send(
        self, session_id: str, message: str, *, trace: Mapping[str, str] | None = None
    ) -> tuple[str, int]:
        """Start a run of the session on `message`; its run id and its first event's id.

        `trace` is the requester's trace context (`agent_flow.telemetry.propagation`): the
        run, which outlives the request, continues that trace.

        Raises:
            ApiError: 404 for an unknown session, 409 (with its id) while a run is under way.
        """
        live = await self.live(session_id)
        async with live.lock:
            if live.running:
                raise ApiError(
                    409,
                    "run_in_progress",
                    f"session {session_id!r} is running {live.run_id}; wait for it to finish "
                    "or cancel it",
                    run_id=live.run_id or "",
                )
            if self.durable is not None:
                return await self._enqueue(live, self.durable, message, trace)
            agent = await self.agent(live)
            base = (await self.info(session_id)).event_count
            first = len(agent.history) == 0 and agent.environment.task.objective == ""
            coroutine = agent.run(message) if first else agent.send(message)
            run_id = agent.run_id
            assert run_id is not None  # claimed by run/send just now
            live.bases[run_id] = base
            live.buffer = []
            live.run_id = run_id
            live.task = asyncio.create_task(_drive(session_id, coroutine, trace))
        return run_id, base

    async def _enqueue(
        self,
        live: LiveSession,
        durable: DurableClient,
        message: str,
        trace: Mapping[str, str] | None,
    ) -> tuple[str, int]:
        config = self.session_config(live.options)
        base = (await self.info(live.id)).event_count
        # The queued run carries the requester's trace to the worker that executes it.
        with attached_context(trace):
            handle = await durable.enqueue(live.id, message, config=config, run_id=uuid.uuid4().hex)
        self._handles[live.id] = handle
        live.run_id = handle.run_id
        live.task = asyncio.create_task(
            _drive(live.id, until_finished(self.store, handle, base)),
            name=f"agent_flow.durable_run:{handle.run_id}",
        )
        return handle.run_id, base

    async def cancel(self, session_id: str) -> str:
        """Cancel the session's run and return its id (409 when none runs)."""
        live = await self.live(session_id)
        handle = self._handles.get(session_id)
        if handle is not None and live.running:
            await handle.cancel()
            return handle.run_id
        if not live.running or live.agent is None or live.run_id is None:
            raise ApiError(409, "not_running", f"session {session_id!r} has no run to cancel")
        live.agent.cancel()
        return live.run_id

    async def answer(self, session_id: str, call_id: str, response: ApprovalResponse) -> None:
        """Answer the approval the call `call_id` waits for (409 when it waits for none)."""
        live = await self.live(session_id)
        if not live.answer(call_id, response):
            raise ApiError(
                409,
                "not_waiting",
                f"no tool call {call_id!r} is waiting for approval in session {session_id!r}",
                field="call_id",
            )

    async def delete(self, session_id: str) -> None:
        """Stop the session's run, release its agent, and delete it from the store."""
        live = await self.live(session_id)
        handle = self._handles.get(session_id)
        if handle is not None and live.running:
            await handle.cancel()
        await self._release(live)
        self._live.pop(session_id, None)
        with contextlib.suppress(SessionNotFoundError):
            await self.store.delete(session_id)

    async def _release(self, live: LiveSession) -> None:
        self._handles.pop(live.id, None)  # a durable run goes on in its worker
        task = live.task
        if task is not None and not task.done():
            if live.agent is not None:
                live.agent.cancel()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if live.agent is not None:
            try:
                await live.agent.aclose()
            finally:
                live.agent = None
                closer = self._closers.pop(live.id, None)
                if closer is not None:
                    await closer()
        live.bus.close()

    async def aclose(self) -> None:
        """Stop every run and release every agent (the store is the caller's)."""
        lives, self._live = list(self._live.values()), {}
        for live in lives:
            try:
                await self._release(live)
            except Exception:
                logger.exception("releasing session %s failed", live.id)


async def _drive(
    session_id: str, coroutine: Awaitable[object], trace: Mapping[str, str] | None = None
) -> object:
    try:
        with attached_context(trace):
            return await coroutine
    except asyncio.CancelledError:
        raise
    except Exception as err:
        # The run reported its failure as events; the log keeps the type, never the config.
        logger.warning("run of session %s failed: %s", session_id, type(err).__name__)
        return None
