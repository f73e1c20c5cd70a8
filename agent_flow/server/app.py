"""`create_app`: the FastAPI application of `agent-flow serve` (mountable in any ASGI app).

Routes (JSON unless said otherwise; every 4xx body is an `ErrorBody`):

- ``POST /sessions`` create; ``GET /sessions`` list; ``GET /sessions/{id}`` read;
  ``DELETE /sessions/{id}`` delete;
- ``POST /sessions/{id}/messages`` start a run (202 with its id; 409 while one runs);
- ``GET /sessions/{id}/events`` the event stream (SSE; ``Last-Event-ID`` resumes it);
- ``GET /sessions/{id}/approvals``, ``POST /sessions/{id}/approvals/{call_id}``;
- ``POST /sessions/{id}/cancel``; ``POST /sessions/{id}/resume``;
- ``GET /sessions/{id}/export`` JSON lines;
- ``POST /agui`` AG-UI (`agent_flow.server._agui`);
- ``GET /`` the inspector page (``static/``; it calls the routes above).
"""

from __future__ import annotations

import importlib.resources
import io
import json
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal

from ag_ui.core import RunAgentInput
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig
from agent_flow.environment import Environment
from agent_flow.events import ContextBuilt
from agent_flow.history import History
from agent_flow.server._agui import AgUiRun, user_text
from agent_flow.server._live import LiveSession
from agent_flow.server._manager import ApiError, LLMFactory, SessionManager, ToolsFactory
from agent_flow.server._middleware import BearerTokenMiddleware, BodyLimitMiddleware
from agent_flow.server._sse import EventStreamResponse
from agent_flow.server.models import (
    SESSION_ID_PATTERN,
    ApprovalDecision,
    ApprovalView,
    CreateSession,
    ErrorBody,
    HistorySummary,
    MessageAccepted,
    RunCancelled,
    SendMessage,
    SessionList,
    SessionSummary,
    SessionView,
)
from agent_flow.server.settings import ServerSettings
from agent_flow.sessions.models import SessionInfo
from agent_flow.sessions.protocol import SessionStore
from agent_flow.telemetry.propagation import TRACE_HEADERS, inject_context
from agent_flow.tools import ApprovalResponse

if TYPE_CHECKING:
    from agent_flow.durable import DurableClient

__all__ = ["create_app"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in (
        (400, "Malformed request"),
        (401, "Missing or wrong bearer token"),
        (404, "Unknown session"),
        (409, "Conflict with the session's state"),
        (413, "Request body too large"),
        (422, "Invalid field"),
    )
}
SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN, max_length=128)]


async def _live_session(request: Request, session_id: SessionId) -> LiveSession:
    manager: SessionManager = request.app.state.manager
    return await manager.live(session_id)


Live = Annotated[LiveSession, Depends(_live_session)]


def create_app(
    config: AgentConfig,
    *,
    store: SessionStore,
    settings: ServerSettings | None = None,
    llm_factory: LLMFactory | None = None,
    tools_factory: ToolsFactory | None = None,
    on_agent: Callable[[AgentExecutor], object] | None = None,
    durable: DurableClient | None = None,
) -> FastAPI:
    """Build the service for agents configured by `config`, keeping sessions in `store`.

    Args:
        config: The agent config every session starts from (sessions may choose a model,
            base URL, workspace under `ServerSettings.workspace_roots`, skill and budget).
        store: Where sessions live; the caller opens and closes it.
        settings: Token, CORS, limits (defaults: loopback, no token, no CORS).
        llm_factory: Builds a session's model client (default: an `OpenAIClient` from the
            session's config).
        tools_factory: Builds a session's tool executor (default: from the session's config).
        on_agent: Called with each session's agent once it is built, before its first run:
            ``agent_flow.telemetry.instrument`` traces the runs (a run started by a request
            that carries a W3C ``traceparent`` joins the caller's trace).
        durable: Enqueue runs for `agent_flow.durable` workers instead of running them here
            (the caller opens and closes it); event streams then tail `store`, which must be
            the workers' store. Approvals and AG-UI need in-process runs: not offered then.
    """
    settings = settings if settings is not None else ServerSettings()
    manager = SessionManager(
        config,
        store,
        settings,
        llm_factory=llm_factory,
        tools_factory=tools_factory,
        on_agent=on_agent,
        durable=durable,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await manager.aclose()

    app = FastAPI(
        title="agent_flow",
        summary="Stateful tool-using agents over HTTP, with live event streams.",
        version="0.1.0",
        lifespan=lifespan,
        responses=_ERRORS,
    )
    app.state.manager = manager
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    if settings.token is not None:
        app.add_middleware(BearerTokenMiddleware, token=settings.token.get_secret_value())
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    _install_error_handlers(app)

    @app.post("/sessions", status_code=201, response_model=SessionView)
    async def create_session(body: CreateSession) -> SessionView:
        """Create a session with the server's agent config and the given options."""
        info = await manager.create(body)
        return await _view(manager, await manager.live(info.id), info)

    @app.get("/sessions", response_model=SessionList)
    async def list_sessions(limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> SessionList:
        """List sessions, the most recently updated first."""
        infos = await store.list(limit=limit)
        return SessionList(sessions=[_summary(info, manager) for info in infos])

    @app.get("/sessions/{session_id}", response_model=SessionView)
    async def read_session(live: Live) -> SessionView:
        """Read a session: status, environment, history summary, last prompt, approvals."""
        return await _view(manager, live, await manager.info(live.id))

    @app.delete("/sessions/{session_id}", status_code=204)
    async def delete_session(live: Live) -> None:
        """Delete a session (its run is cancelled first)."""
        await manager.delete(live.id)

    @app.post("/sessions/{session_id}/messages", status_code=202, response_model=MessageAccepted)
    async def send_message(live: Live, body: SendMessage, request: Request) -> MessageAccepted:
        """Start a run on a user message; answers at once (watch the events)."""
        run_id, first = await manager.send(live.id, body.message, trace=_trace_carrier(request))
        return MessageAccepted(session_id=live.id, run_id=run_id, first_event_id=first)

    @app.post("/sessions/{session_id}/resume", response_model=SessionView)
    async def resume_session(live: Live) -> SessionView:
        """Load a stored session's agent now (e.g. after a restart; a message also does)."""
        await manager.agent(live)
        return await _view(manager, live, await manager.info(live.id))

    @app.post("/sessions/{session_id}/cancel", response_model=RunCancelled)
    async def cancel_run(live: Live) -> RunCancelled:
        """Cancel the session's run (it ends as ``cancelled``)."""
        return RunCancelled(session_id=live.id, run_id=await manager.cancel(live.id))

    @app.get("/sessions/{session_id}/approvals", response_model=list[ApprovalView])
    async def list_approvals(live: Live) -> list[ApprovalView]:
        """The tool calls waiting for approval."""
        return _approvals(live)

    @app.post("/sessions/{session_id}/approvals/{call_id}", status_code=204, response_model=None)
    async def answer_approval(
        live: Live,
        call_id: Annotated[str, Path(min_length=1, max_length=256)],
        body: ApprovalDecision,
    ) -> None:
        """Approve or deny a waiting tool call (409 when it is not waiting)."""
        await manager.answer(
            live.id, call_id, ApprovalResponse(approved=body.approved, reason=body.reason)
        )

    @app.get(
        "/sessions/{session_id}/export",
        response_class=PlainTextResponse,
        responses={200: {"content": {"application/x-ndjson": {}}}},
    )
    async def export_session(live: Live) -> PlainTextResponse:
        """The session as JSON lines (the library's export format)."""
        buffer = io.StringIO()
        await store.export(live.id, buffer)
        return PlainTextResponse(buffer.getvalue(), media_type="application/x-ndjson")

    @app.get(
        "/sessions/{session_id}/events",
        response_class=StreamingResponse,
        response_model=None,
        responses={
            200: {
                "description": "The session's events as Server-Sent Events",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        },
    )
    async def stream_events(
        live: Live,
        start: Annotated[int, Depends(_resume_point)],
        policy: Annotated[Literal["wait", "drop_oldest"], Query()] = "drop_oldest",
        follow: Annotated[bool, Query(description="Stay open for live events.")] = True,
    ) -> StreamingResponse:
        """Every event of the session as SSE, ``id:`` its position; replays after an id.

        ``Last-Event-ID`` (or ``after``) resumes after that id: missed events come from the
        store, then live ones, with no gap and no duplicate. An ``events_dropped`` event
        (no id) tells a client that fell behind under ``drop_oldest`` what it missed. An idle
        stream gets a ``: ping`` comment every `ServerSettings.keepalive_seconds`.
        """
        return EventStreamResponse(
            live,
            start,
            policy=policy,
            maxsize=settings.watcher_queue,
            follow=follow,
            idle=settings.keepalive_seconds,
        )

    @app.get("/", include_in_schema=False)
    async def inspector() -> HTMLResponse:
        """The inspector page (static; it reads everything through the API)."""
        return HTMLResponse(_static("index.html"))

    @app.get("/static/{name}", include_in_schema=False)
    async def inspector_asset(name: str) -> Response:
        """The inspector's script and style sheet."""
        media = _ASSETS.get(name)
        if media is None:
            raise ApiError(404, "not_found", f"no inspector file is called {name!r}")
        return Response(_static(name), media_type=media)

    @app.post(
        "/agui",
        response_model=None,
        responses={
            200: {"description": "AG-UI events (SSE)", "content": {"text/event-stream": {}}}
        },
    )
    async def agui_run(body: RunAgentInput, request: Request) -> StreamingResponse:
        """AG-UI: run the thread's session on the last user message; stream AG-UI events.

        The thread id is the session id (a session is created for a new thread). The
        environment is the shared state: a ``STATE_SNAPSHOT`` first, then ``STATE_DELTA``
        JSON Patches as it changes.
        """
        thread = body.thread_id
        if not re.fullmatch(SESSION_ID_PATTERN, thread):
            raise ApiError(
                422,
                "invalid_field",
                f"threadId {thread!r} is not a valid session id; use 1 to 128 letters, digits "
                "or '._:-', starting with a letter or digit",
                field="threadId",
            )
        message = user_text(body)
        if message is None:
            raise ApiError(
                422, "invalid_field", "messages holds no user message with text", field="messages"
            )
        if manager.loaded(thread) is None:
            try:
                await manager.info(thread)
            except ApiError:
                await manager.create(CreateSession(session_id=thread, title=message[:80]))
        live = await manager.live(thread)
        agent = await manager.agent(live)
        subscription = live.bus.subscribe(policy="wait", maxsize=settings.watcher_queue)
        run = AgUiRun(thread, body.run_id, agent.environment)
        try:
            agent_run_id, _ = await manager.send(thread, message, trace=_trace_carrier(request))
        except BaseException:
            await subscription.aclose()
            raise
        return StreamingResponse(
            run.stream(subscription, agent_run_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    return app


def _trace_carrier(request: Request) -> dict[str, str]:
    """The trace context a run started by `request` continues, captured now.

    A span current here is an OpenTelemetry ASGI middleware's (the request's server span):
    the run is its child. Otherwise the request's own W3C headers, if it brings them.
    Without OpenTelemetry loaded there is no span and nothing is imported for one.
    """
    if "opentelemetry.trace" in sys.modules and (current := inject_context()):
        return current
    return {name: value for name in TRACE_HEADERS if (value := request.headers.get(name))}


#: The inspector's files besides the page, with their media types.
_ASSETS = {"inspector.js": "text/javascript", "inspector.css": "text/css"}


def _static(name: str) -> str:
    return (importlib.resources.files("agent_flow.server") / "static" / name).read_text("utf-8")


def _resume_point(
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    after: Annotated[int | None, Query(ge=-1, description="Resume after this id.")] = None,
) -> int:
    if last_event_id is None:
        return -1 if after is None else after
    try:
        value = int(last_event_id)
    except ValueError:
        value = -2
    if value < -1:
        raise ApiError(
            400,
            "bad_last_event_id",
            f"Last-Event-ID {last_event_id!r} is not an event id; send the id of the last "
            "event received",
            field="Last-Event-ID",
        )
    return value


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        body = ErrorBody(code=err.code, message=err.message, field=err.field, run_id=err.run_id)
        return JSONResponse(body.model_dump(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid", "type": ""}
        loc = [str(part) for part in first.get("loc", ())]
        where = ".".join(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
        if first.get("type") == "json_invalid":
            body = ErrorBody(
                code="malformed_json",
                message=f"the request body is not valid JSON ({first.get('msg')}); send JSON",
                field=where or None,
            )
            return JSONResponse(body.model_dump(), status_code=400)
        body = ErrorBody(
            code="invalid_field",
            message=f"{where or 'the request'}: {first.get('msg')}",
            field=where or None,
        )
        return JSONResponse(body.model_dump(), status_code=422)


def _summary(info: SessionInfo, manager: SessionManager) -> SessionSummary:
    live = manager.loaded(info.id)
    running = live is not None and live.running
    return SessionSummary(
        id=info.id,
        title=info.title,
        agent=info.agent,
        status=info.status,
        running=running,
        run_id=live.run_id if live is not None else None,
        created_at=info.created_at,
        updated_at=info.updated_at,
        steps=info.steps,
        event_count=info.event_count,
        model_calls=info.model_calls,
        prompt_tokens=info.prompt_tokens,
        completion_tokens=info.completion_tokens,
        cost_usd=info.cost_usd,
        unpriced_calls=info.unpriced_calls,
        estimated_calls=info.estimated_calls,
    )


def _approvals(live: LiveSession) -> list[ApprovalView]:
    return [
        ApprovalView(
            call_id=request.call_id,
            name=request.tool_name,
            arguments=request.arguments,
            reason=request.reason,
        )
        for request in live.pending_approvals()
    ]


async def _view(manager: SessionManager, live: LiveSession, info: SessionInfo) -> SessionView:
    environment: Environment | None
    history: History
    if live.agent is not None:
        environment, history = live.agent.environment, live.agent.history
    else:
        state = await manager.store.load(live.id)
        environment, history = state.environment, state.history()
    last_prompt = live.last_prompt
    if last_prompt is None and info.event_count:
        recent = await manager.store.events(live.id, offset=max(0, info.event_count - 500))
        for event in reversed(recent):
            if isinstance(event, ContextBuilt):
                last_prompt = event.breakdown
                break
    summary = _summary(info, manager)
    env = environment if environment is not None else Environment()
    return SessionView(
        **summary.model_dump(),
        options=live.options,
        environment=json.loads(env.to_json())["state"],
        environment_version=env.version,
        history=HistorySummary(
            entries=len(history.entries),
            tokens=history.token_count(),
            kinds=dict(Counter(type(entry).__name__ for entry in history.entries)),
        ),
        last_prompt=last_prompt,
        pending_approvals=_approvals(live),
        state="running" if live.running else "idle",
    )
