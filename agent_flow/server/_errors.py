"""The one error shape of the service: `ApiError`, and the handlers that answer with `ErrorBody`.

Every refusal, whoever makes it (a route, a middleware, FastAPI's validation, Starlette's
router), is an `ErrorBody` with a stable ``code``:

=====  ===========================================================================
400    ``malformed_json``, ``bad_request``, ``bad_last_event_id``
401    ``unauthorized`` (with ``WWW-Authenticate: Bearer``)
403    ``forbidden_origin``
404    ``not_found`` (an unknown route, or a session that is not the caller's)
405    ``method_not_allowed`` (with ``Allow``)
409    ``session_exists``, ``run_in_progress``, ``not_running``, ``not_waiting``, ...
413    ``body_too_large``
415    ``unsupported_media_type``
421    ``unknown_host``
422    ``invalid_field``, ``invalid_option``, ``invalid_config``, ``unknown_llm``, ...
503    ``shutting_down``, ``store_unavailable`` (the session store failed; the log has why)
=====  ===========================================================================
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match, Route
from starlette.types import Send

from agent_flow._unicode import mend
from agent_flow.errors import (
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
)

__all__ = [
    "ApiError",
    "error_body",
    "install_error_handlers",
    "not_running",
    "not_waiting",
    "run_in_progress",
    "send_error",
    "session_exists",
    "session_not_found",
]

logger = logging.getLogger(__name__)
audit = logging.getLogger("agent_flow.server.audit")

#: Starlette's own refusals, by status: their code and sentence.
_HTTP_CODES = {
    400: ("bad_request", "the request could not be read (a body that is not UTF-8 JSON?)"),
    404: ("not_found", "no route has this path; see /docs for the API"),
    405: ("method_not_allowed", "this route does not take this method"),
}


class ApiError(Exception):
    """A client's mistake, answered with `status` and an `ErrorBody`."""

    def __init__(
        self, status: int, code: str, message: str, *, field: str = "", run_id: str = ""
    ) -> None:
        # A message or field may quote the client's text, escapes and all: a lone surrogate
        # in it could not be sent (it becomes U+FFFD).
        message, field = mend(message), mend(field)
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


def session_not_found(session_id: str) -> ApiError:
    """404: no session has this id (or it is another user's)."""
    return ApiError(404, "not_found", f"no session has the id {session_id!r}", field="session_id")


def session_exists(session_id: str | None) -> ApiError:
    """409: a session with the id asked for is already stored."""
    message = f"session {session_id!r} exists; choose another id or omit it"
    return ApiError(409, "session_exists", message, field="session_id")


def run_in_progress(session_id: str | None, run_id: str, where: str = "") -> ApiError:
    """409: the session runs `run_id` (`where`: in which process, when said)."""
    who = "the session" if session_id is None else f"session {session_id!r}"
    return ApiError(
        409,
        "run_in_progress",
        f"{who} is running {run_id}{where}; wait for it to finish or cancel it",
        run_id=run_id,
    )


def not_running(session_id: str, elsewhere: str | None) -> ApiError:
    """409: the session has no run to cancel (`elsewhere`: the run another process runs)."""
    where = f" in this server: its run {elsewhere} runs in another process; cancel it there"
    return ApiError(
        409,
        "not_running",
        f"session {session_id!r} has no run to cancel{where if elsewhere else ''}",
        run_id=elsewhere or "",
    )


def not_waiting(session_id: str, call_id: str, elsewhere: str | None) -> ApiError:
    """409: no approval of `call_id` waits (`elsewhere`: the run another process runs)."""
    where = (
        f" of this server: its run {elsewhere} holds the session in another process, which "
        "holds its approvals; answer there"
        if elsewhere
        else ""
    )
    return ApiError(
        409,
        "not_waiting",
        f"no tool call {call_id!r} is waiting for approval in session {session_id!r}{where}",
        field="call_id",
        run_id=elsewhere or "",
    )


def _rebuild_api_error(status: int, code: str, message: str, field: str, run_id: str) -> ApiError:
    return ApiError(status, code, message, field=field, run_id=run_id)


def error_body(
    code: str, message: str, field: str | None = None, run_id: str | None = None
) -> bytes:
    """An `ErrorBody` as JSON bytes."""
    return json.dumps(
        {"code": code, "message": message, "field": field, "run_id": run_id}, ensure_ascii=False
    ).encode()


async def send_error(
    send: Send,
    status: int,
    code: str,
    message: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with `status` and an `ErrorBody` (for middleware, before any route runs)."""
    body = error_body(code, message)
    all_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    if status == 401:
        all_headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


def _allowed_methods(request: Request) -> str:
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches({**request.scope, "method": "GET"})
            if match is not Match.NONE:
                methods |= route.methods
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    """Answer every refusal and failure of a request with an `ErrorBody`.

    `ApiError`, validation errors and Starlette's refusals with their own codes; a failure
    nothing expects with 500 ``internal_error``, its cause in the server's log only.
    """

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(
            {"code": err.code, "message": err.message, "field": err.field, "run_id": err.run_id},
            status_code=err.status,
        )

    @app.exception_handler(SessionNotFoundError)
    async def gone(request: Request, err: SessionNotFoundError) -> JSONResponse:
        # Deleted by another request (or process) while this one was reading it.
        return JSONResponse(
            {"code": "not_found", "message": str(err), "field": "session_id", "run_id": None},
            status_code=404,
        )

    @app.exception_handler(StoreError)
    async def store_failed(request: Request, err: StoreError) -> JSONResponse:
        # Routes answer the store's refusals they expect; these come from a race with another
        # request or process, or from the store itself failing.
        if isinstance(err, SessionExistsError):
            refusal = ApiError(409, "session_exists", str(err), field="session_id")
        elif isinstance(err, SessionBusyError):
            refusal = run_in_progress(None, err.run_id, " (in this or another process)")
        else:
            # A dropped connection, a database that is down: the cause stays in the log (it
            # may name hosts and databases); the client learns that it may try again.
            logger.error(
                "%s %s: the session store failed", request.method, request.url.path, exc_info=err
            )
            refusal = ApiError(
                503,
                "store_unavailable",
                "the session store failed while answering (the server's log says why); try again",
            )
        return await api_error(request, refusal)

    @app.exception_handler(Exception)
    async def failed(request: Request, err: Exception) -> JSONResponse:
        # A bug, or a failure nothing above expects: Starlette's answer would be plain text.
        # The cause stays in the server's log, as it may name hosts, paths or secrets: one
        # line here, and the traceback from uvicorn (Starlette raises it again after this).
        logger.error(
            "%s %s: answered 500 internal_error: %s: %s",
            request.method,
            request.url.path,
            type(err).__name__,
            err,
        )
        refusal = ApiError(
            500, "internal_error", "the server failed while answering (its log says why)"
        )
        return await api_error(request, refusal)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        code, message = _HTTP_CODES.get(err.status_code, ("http_error", str(err.detail)))
        headers = dict(err.headers or {})
        if err.status_code == 405:
            # Starlette names the methods of the first route of this path only; a path served
            # by several routes (GET and POST /sessions) allows all of theirs.
            allowed = _allowed_methods(request) or headers.get("Allow", "")
            headers["Allow"] = allowed
            message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
        return JSONResponse(
            {"code": code, "message": message, "field": None, "run_id": None},
            status_code=err.status_code,
            headers=headers,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid", "type": ""}
        loc = [str(part) for part in first.get("loc", ())]
        where = ".".join(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
        # A key the client sent may hold a lone surrogate, which no answer can carry.
        where, said = mend(where), mend(str(first.get("msg")))
        if first.get("type") == "json_invalid":
            return JSONResponse(
                {
                    "code": "malformed_json",
                    "message": f"the request body is not valid JSON ({said}); send JSON",
                    "field": where or None,
                    "run_id": None,
                },
                status_code=400,
            )
        return JSONResponse(
            {
                "code": "invalid_field",
                "message": f"{where or 'the request'}: {said}",
                "field": where or None,
                "run_id": None,
            },
            status_code=422,
        )
