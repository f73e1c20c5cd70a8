"""`create_app`: the FastAPI application of `agent-flow serve` (mountable in any ASGI app).

Routes (JSON unless said otherwise; every 4xx body is an `ErrorBody`):

- ``GET /endpoints`` the model endpoints and models a session may choose;
- ``POST /sessions`` create; ``GET /sessions`` list; ``GET /sessions/{id}`` read;
  ``DELETE /sessions/{id}`` delete;
- ``POST /sessions/{id}/messages`` start a run (202 with its id; 409 while one runs);
- ``GET /sessions/{id}/events`` the event stream (SSE; ``Last-Event-ID`` resumes it);
- ``GET /sessions/{id}/approvals``, ``POST /sessions/{id}/approvals/{call_id}``;
- ``POST /sessions/{id}/cancel``; ``POST /sessions/{id}/resume``;
- ``GET /sessions/{id}/export`` JSON lines;
- ``GET /sessions/{id}/prompts/{event_id}`` the prompt a step sent (`agent_flow.server._prompts`);
- ``POST /agui`` AG-UI (`agent_flow.server._agui_route`);
- ``GET /`` the inspector page (``static/``; it calls the routes above).

Before any route, `agent_flow.server._auth.GuardMiddleware` refuses foreign ``Host`` names,
foreign ``Origin``s of state-changing requests and missing or unknown tokens; a session is
seen only by the user who created it and by admins (another user's is a 404).
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

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from pydantic import WithJsonSchema

from agent_flow.agent import AgentExecutor, counter_for
from agent_flow.config import AgentConfig
from agent_flow.environment import Environment
from agent_flow.events import ContextBuilt
from agent_flow.history import History
from agent_flow.server._agui import AgUiInput
from agent_flow.server._agui_route import agui_run as agui_stream
from agent_flow.server._auth import GuardMiddleware, User, Users, audit_log, request_user
from agent_flow.server._endpoints import EndpointList, endpoints
from agent_flow.server._errors import ApiError, install_error_handlers
from agent_flow.server._live import LiveSession
from agent_flow.server._manager import LLMFactory, SessionManager, ToolsFactory
from agent_flow.server._middleware import BodyLimitMiddleware
from agent_flow.server._openapi import EVENT_STREAM, Refusals, complete_document
from agent_flow.server._prompts import PromptView, prompt_of
from agent_flow.server._sse import EventStreamResponse
from agent_flow.server.models import (
    EVENT_ID_PATTERN,
    MAX_EVENT_ID,
    SESSION_ID_PATTERN,
    ApprovalDecision,
    ApprovalView,
    CreateSession,
    HistorySummary,
    MessageAccepted,
    NoOptions,
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

SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN, max_length=128)]
#: The body of cancel and resume (``{}``; an empty body with ``Content-Type: application/json``
#: is taken as that too).
Options = Annotated[NoOptions, Body(description="Nothing to choose: send `{}`.")]
_NO_OPTIONS = NoOptions()


async def _live_session(request: Request, session_id: SessionId) -> LiveSession:
    manager: SessionManager = request.app.state.manager
    return await manager.live(session_id, request_user(request.scope))


async def _user(request: Request) -> User:
    # Dependencies are coroutines: FastAPI runs a plain function's on a worker thread, a
    # thread hand-off per request for a dictionary lookup.
    return request_user(request.scope)


Live = Annotated[LiveSession, Depends(_live_session)]
CurrentUser = Annotated[User, Depends(_user)]


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
            session's config). Called in a worker thread, as the rest of an agent's build,
            each time a session's agent is built (its first message, and again after an
            eviction or another process's run). What it returns stays the caller's: the
            server never closes it, as a factory may hand every session one shared client;
            return shared clients (one per endpoint), and close them after the app's shutdown.
        tools_factory: Builds a session's tool executor (default: from the session's config).
            Called in a worker thread too.
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
    )
    app.state.manager = manager
    users = Users.build(
        token=settings.token.get_secret_value() if settings.token is not None else None,
        tokens_file=settings.tokens_file,
    )
    refusals = Refusals(tokens=users is not None, max_body_bytes=settings.max_body_bytes)
    # Without tokens only a JSON POST is taken (the guard's 415): the body-less actions
    # document `{}` as required so that a client sends the header.
    options_body = None if users is not None else {"requestBody": {"required": True}}
    # Starlette runs the middleware added last first: CORS answers preflights, then the guard
    # refuses foreign hosts, origins and tokens before a body is read.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(
        GuardMiddleware,
        users=users,
        server_names=(*settings.server_names, settings.host),
        origins=settings.cors_origins,
        routes=app.router.routes,
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    install_error_handlers(app)

    @app.post(
        "/sessions",
        status_code=201,
        response_model=SessionView,
        responses=refusals.of("POST", 409, 422),
    )
    async def create_session(body: CreateSession, user: CurrentUser) -> SessionView:
        """Create a session with the server's agent config and the given options.

        It belongs to the caller: other users (but admins) see it as a 404. The model endpoint
        is one of ``GET /endpoints`` (a ``base_url`` of the client's own only where the
        server allows it: 422 ``client_endpoint_not_allowed`` otherwise).
        """
        info = await manager.create(body, owner=_owner(user, users))
        return await _view(manager, await manager.live(info.id, user), info)

    @app.get("/sessions", response_model=SessionList, responses=refusals.of("GET", 422))
    async def list_sessions(
        user: CurrentUser, limit: Annotated[int, Query(ge=1, le=1000)] = 50
    ) -> SessionList:
        """List the caller's sessions (an admin's: every session), most recently updated first."""
        infos = await store.list(limit=limit, owner=None if user.admin else user.name)
        return SessionList(sessions=[_summary(info, manager) for info in infos])

    @app.get("/endpoints", response_model=EndpointList, responses=refusals.of("GET"))
    async def list_endpoints() -> EndpointList:
        """The model endpoints and models a session may choose (never their URLs or keys)."""
        return endpoints(config, client_endpoints=settings.allow_client_endpoints)

    @app.get(
        "/sessions/{session_id}",
        response_model=SessionView,
        responses=refusals.of("GET", 404, 422),
    )
    async def read_session(live: Live) -> SessionView:
        """Read a session: status, environment, history summary, last prompt, approvals."""
        return await _view(manager, live, await manager.info(live.id))

    @app.delete(
        "/sessions/{session_id}",
        status_code=204,
        responses=refusals.of("DELETE", 404, 409, 422, 503),
    )
    async def delete_session(live: Live, user: CurrentUser) -> None:
        """Delete a session (its run here is cancelled first; 409 while another process runs it)."""
        await manager.delete(live.id, user)
        audit_log("deleted", user=user.name, session=live.id, owner=live.owner)

    @app.post(
        "/sessions/{session_id}/messages",
        status_code=202,
        response_model=MessageAccepted,
        responses=refusals.of("POST", 404, 409, 422, 503),
    )
    async def send_message(live: Live, body: SendMessage, request: Request) -> MessageAccepted:
        """Start a run on a user message; answers at once (watch the events)."""
        run_id, first = await manager.send(live.id, body.message, trace=_trace_carrier(request))
        return MessageAccepted(session_id=live.id, run_id=run_id, first_event_id=first)

    @app.post(
        "/sessions/{session_id}/resume",
        response_model=SessionView,
        responses=refusals.of("POST", 404, 409, 422, 503),
        openapi_extra=options_body,
    )
    async def resume_session(live: Live, options: Options = _NO_OPTIONS) -> SessionView:
        """Load a stored session's agent now (e.g. after a restart; a message also does)."""
        await manager.resume(live.id)
        live = manager.loaded(live.id) or live
        return await _view(manager, live, await manager.info(live.id))

    @app.post(
        "/sessions/{session_id}/cancel",
        response_model=RunCancelled,
        responses=refusals.of("POST", 404, 409, 422),
        openapi_extra=options_body,
    )
    async def cancel_run(live: Live, options: Options = _NO_OPTIONS) -> RunCancelled:
        """Cancel the session's run (it ends as ``cancelled``)."""
        return RunCancelled(session_id=live.id, run_id=await manager.cancel(live.id))

    @app.get(
        "/sessions/{session_id}/approvals",
        response_model=list[ApprovalView],
        responses=refusals.of("GET", 404, 422),
    )
    async def list_approvals(live: Live) -> list[ApprovalView]:
        """The tool calls waiting for approval."""
        return _approvals(live)

    @app.post(
        "/sessions/{session_id}/approvals/{call_id}",
        status_code=204,
        response_model=None,
        responses=refusals.of("POST", 404, 409, 422),
    )
    async def answer_approval(
        live: Live,
        call_id: Annotated[str, Path(min_length=1, max_length=256)],
        body: ApprovalDecision,
        user: CurrentUser,
    ) -> None:
        """Approve or deny a waiting tool call (409 when it is not waiting).

        The decision and who made it are logged and kept in the ``approval_resolved`` event.
        """
        decision = "approved" if body.approved else "denied"
        try:
            await manager.answer(
                live.id,
                call_id,
                ApprovalResponse(approved=body.approved, reason=body.reason, decided_by=user.name),
            )
        except ApiError as err:
            audit_log("approval", user=user.name, session=live.id, call=call_id, decision=err.code)
            raise
        audit_log("approval", user=user.name, session=live.id, call=call_id, decision=decision)

    @app.get(
        "/sessions/{session_id}/export",
        # A plain `Response` has no media type of its own: the errors stay application/json.
        response_class=Response,
        responses={
            200: {
                "description": "The session as JSON lines",
                "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            },
            **refusals.of("GET", 404, 422),
        },
    )
    async def export_session(live: Live) -> Response:
        """The session as JSON lines (the library's export format)."""
        buffer = io.StringIO()
        await store.export(live.id, buffer)
        return Response(buffer.getvalue(), media_type="application/x-ndjson")

    @app.get(
        "/sessions/{session_id}/events",
        response_class=StreamingResponse,
        response_model=None,
        responses={
            200: {
                "description": "The session's events, as Server-Sent Events",
                "content": EVENT_STREAM,
            },
            **refusals.of("GET", 400, 404, 422),
        },
    )
    async def stream_events(
        live: Live,
        start: Annotated[int, Depends(_resume_point)],
        policy: Annotated[
            Literal["wait", "drop_oldest", "drop_deltas_first"], Query()
        ] = "drop_deltas_first",
        follow: Annotated[bool, Query(description="Stay open for live events.")] = True,
    ) -> StreamingResponse:
        """Every event of the session as SSE, ``id:`` its position; replays after an id.

        ``Last-Event-ID`` (or ``after``) resumes after that id: missed events come from the
        store, then live ones, with no gap and no duplicate. An ``events_dropped`` event
        (no id) tells a client that fell behind what it missed: under ``drop_deltas_first``
        (the default) the oldest text, thinking and argument deltas go first and lifecycle
        events only when no delta is queued; under ``drop_oldest`` the oldest events. Under
        ``wait`` the run waits for a client that fell behind only up to
        `ServerSettings.watcher_max_wait` seconds; then its oldest events are dropped and an
        ``events_dropped`` event tells it so, as under ``drop_oldest``. An idle stream gets a
        ``: ping`` comment every `ServerSettings.keepalive_seconds`.
        """
        return EventStreamResponse(
            live,
            start,
            policy=policy,
            maxsize=settings.watcher_queue,
            follow=follow,
            idle=settings.keepalive_seconds,
            max_wait=settings.watcher_max_wait,
        )

    @app.get(
        "/sessions/{session_id}/prompts/{event_id}",
        response_model=PromptView,
        responses=refusals.of("GET", 404, 422),
    )
    async def read_prompt(
        live: Live, event_id: Annotated[int, Path(ge=0, le=MAX_EVENT_ID)]
    ) -> PromptView:
        """The prompt one step sent (``event_id``: its ``context_built`` event), as sent.

        Every message with its tokens, the environment's part of the system message, the
        tools offered. A live session keeps its latest steps' prompts; otherwise 404
        ``prompt_not_kept`` (the event itself still has the step's tokens per section).
        """
        return prompt_of(live, event_id)

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
            200: {"description": "AG-UI events (SSE)", "content": {"text/event-stream": {}}},
            **refusals.of("POST", 404, 409, 422, 503),
        },
    )
    async def agui_run(body: AgUiInput, request: Request, user: CurrentUser) -> StreamingResponse:
        """AG-UI: run the thread's session on the new messages; stream AG-UI events.

        The thread id is the session id (a session is created for a new thread, its earlier
        messages seed its history). The environment is the shared state: a
        ``STATE_SNAPSHOT`` first, then ``STATE_DELTA`` JSON Patches as it changes; the
        client's ``state`` is written when it is based on the current ``version`` (422
        ``invalid_state`` when the environment refuses it; otherwise a ``CUSTOM``
        ``state_not_applied`` says it was not). ``context`` lands in the environment's
        knowledge; front-end ``tools`` are offered beside the server's, and a call of one
        ends the run with the call for the client, answered by a tool message in the next
        input. A client declaring ``approve_tool_call`` answers approvals the same way. The
        run waits for a client that stops reading only up to
        `ServerSettings.watcher_max_wait` seconds; then its oldest events are dropped and a
        ``CUSTOM`` event named ``events_dropped`` tells it so.
        """
        return await agui_stream(
            manager,
            settings,
            body,
            user=user,
            owner=_owner(user, users),
            trace=_trace_carrier(request),
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete_document(
                FastAPI.openapi(app), config=config, settings=settings, tokens=users is not None
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _owner(user: User, users: Users | None) -> str | None:
    """Who owns what `user` creates: None on a server without users (the admin's)."""
    return user.name if users is not None else None


def _trace_carrier(request: Request) -> dict[str, str]:
    """The trace context a run started by `request` continues, captured now.

    A span current here is an OpenTelemetry ASGI middleware's (the request's server span):
    the run is its child. Otherwise the request's own W3C headers, if it brings them.
    Without OpenTelemetry loaded there is no span and nothing is imported for one.
    """
    if "opentelemetry.trace" in sys.modules and (current := inject_context()):
        return current
    return {name: value for name in TRACE_HEADERS if (value := request.headers.get(name))}


#: The media types of the inspector's files besides the page.
_MEDIA = {".js": "text/javascript", ".css": "text/css"}
#: The inspector's files besides the page (every script and style sheet in ``static/``).
_ASSETS = {
    item.name: _MEDIA[item.name[item.name.rindex(".") :]]
    for item in importlib.resources.files("agent_flow.server").joinpath("static").iterdir()
    if item.name.endswith(tuple(_MEDIA))
}


def _static(name: str) -> str:
    return (importlib.resources.files("agent_flow.server") / "static" / name).read_text("utf-8")


async def _resume_point(
    last_event_id: Annotated[
        str | None,
        Header(description="Resume after this event id (-1: from the first event)."),
        # Absent or an id: never null (checked here, to answer 400 with its own code).
        WithJsonSchema({"type": "string", "pattern": EVENT_ID_PATTERN}),
    ] = None,
    after: Annotated[
        int | None,
        Query(ge=-1, le=MAX_EVENT_ID, description="Resume after this id (Last-Event-ID wins)."),
        WithJsonSchema({"type": "integer", "minimum": -1, "maximum": MAX_EVENT_ID}),
    ] = None,
) -> int:
    if last_event_id is None:
        return -1 if after is None else after
    if not re.fullmatch(EVENT_ID_PATTERN, last_event_id) or int(last_event_id) > MAX_EVENT_ID:
        raise ApiError(
            400,
            "bad_last_event_id",
            f"Last-Event-ID {last_event_id!r} is not an event id; send the id of the last "
            "event received",
            field="Last-Event-ID",
        )
    return int(last_event_id)


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
    history: History | None
    # A claim since this server's last one (or since it loaded the agent): another server ran
    # the session, and its agent is behind the store until its own next run rebuilds it.
    behind = info.lease_fence > live.fence
    if live.agent is not None and not behind:
        environment, history = live.agent.environment, live.agent.history
    elif info.steps == 0 and info.entry_count == 0 and info.environment_version == 0:
        # Nothing is stored but the session's row (one just created): no load to read that.
        environment, history = None, None
    else:
        state = await manager.store.load(live.id)
        # Counted as the session's agent counts: no other tokenizer is loaded for a view.
        counter = counter_for(manager.session_config(live.options))
        environment, history = state.environment, state.history(counter=counter)
    last_prompt = None if behind else live.last_prompt
    if last_prompt is None and info.event_count:
        recent = await manager.store.events(live.id, offset=max(0, info.event_count - 500))
        for event in reversed(recent):
            if isinstance(event, ContextBuilt) and not event.path:
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
        )
        if history is not None
        else HistorySummary(entries=0, tokens=0, kinds={}),
        last_prompt=last_prompt,
        pending_approvals=_approvals(live),
        state="running" if live.running else "idle",
    )
