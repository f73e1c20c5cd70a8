"""What a failed call to an OpenAI-compatible server raises: SDK exceptions as `ModelError`s.

Private to `agent_flow.llm`. The openai SDK's exceptions (raised after its own retries) become
the precise `ModelError` subclasses `OpenAIClient` promises: HTTP errors carry status, provider
code and body; timeouts, lost connections and unreadable answers each get their own class.
Every message names the server and says what to change, and the API key is redacted from
every message and body a server echoes it in.
"""

from __future__ import annotations

import openai

from agent_flow.errors import (
    ModelAuthenticationError,
    ModelBadRequestError,
    ModelConnectionError,
    ModelError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
)
from agent_flow.llm._openai_retry import parse_retry_after

__all__ = ["redact", "redact_error", "transient_code", "translate_error"]


def translate_error(
    err: openai.OpenAIError,
    *,
    where: str,
    secret: str,
    api_key_env: str,
    streaming: bool,
    connect_timeout: float | None = None,
) -> ModelError:
    """Return the `ModelError` that says what `err` means for a call to `where`.

    Args:
        err: What the SDK raised.
        where: The server's base URL, named in the message.
        secret: The API key, redacted from everything the server sent back.
        api_key_env: The variable the key came from (named when the key was refused).
        streaming: Whether the answer was being streamed when `err` happened.
        connect_timeout: The connect timeout in force (named when connecting timed out).
    """
    if isinstance(err, openai.APIStatusError):
        error = _status_error(err, where=where, secret=secret, api_key_env=api_key_env)
        error.retry_after = parse_retry_after(err.response.headers)
        return error
    if isinstance(err, openai.APITimeoutError):
        if _caused_by(err, "ConnectTimeout"):
            return ModelTimeoutError(
                f"could not connect to the model server at {where} within the connect timeout "
                f"of {connect_timeout:g} s; check that it is running, or raise connect_timeout"
            )
        return ModelTimeoutError(
            f"the model server at {where} did not answer in time"
            f"{' while streaming' if streaming else ''}; raise the timeout or check the server"
        )
    if isinstance(err, openai.APIConnectionError):
        cause = str(redact(str(err.__cause__ or err), secret)) or type(err.__cause__).__name__
        if streaming:
            return ModelConnectionError(
                f"the connection to the model server at {where} was lost mid-answer "
                f"({cause}); the answer is incomplete, retry the request"
            )
        if _caused_by(err, "RemoteProtocolError", "ReadError"):
            return ModelConnectionError(
                f"the model server at {where} accepted the connection and closed it without "
                f"a complete answer ({cause}); it may have crashed or be overloaded"
            )
        return ModelConnectionError(
            f"could not reach the model server at {where} ({cause}); check that it is "
            "running and that the base URL is right"
        )
    if isinstance(err, openai.APIResponseValidationError):
        return ModelResponseError(
            f"the answer from {where} could not be read: {redact(err.message, secret)}"
        )
    if isinstance(err, openai.APIError):
        code = err.code or err.type
        # Not tried again whatever its code: llama-cpp-python refuses a request it can never
        # serve this way, with code 500.
        return ModelResponseError(
            f"the model server at {where} reported an error mid-answer"
            f"{f' ({code})' if code else ''}: {redact(err.message, secret)}"
        )
    return ModelError(f"the model call to {where} failed: {redact(str(err), secret)}")


def _caused_by(err: BaseException, *names: str) -> bool:
    """Whether an exception named one of `names` is in `err`'s cause chain."""
    seen: BaseException | None = err.__cause__ or err.__context__
    for _ in range(8):
        if seen is None:
            return False
        if type(seen).__name__ in names:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _status_error(
    err: openai.APIStatusError, *, where: str, secret: str, api_key_env: str
) -> ModelHTTPError:
    status = err.status_code
    body = redact(err.body, secret)
    code = err.code
    if code is None and isinstance(body, dict):
        kind = body.get("type")
        code = kind if isinstance(kind, str) else None
    detail = _message_of(body) or str(redact(err.message, secret))
    label = f"HTTP {status}" + (f" ({code})" if code else "")
    cls: type[ModelHTTPError]
    if status in (401, 403):
        cls = ModelAuthenticationError
        advice = f"check the API key (environment variable {api_key_env})"
    elif status == 429:
        cls = ModelRateLimitError
        advice = "the server is rate limiting; wait or lower the request rate"
    elif status >= 500:
        cls = ModelServerError
        advice = "the server failed; retry later"
    else:
        cls = ModelBadRequestError
        advice = (
            "check the model name and base URL"
            if status == 404
            else "the server refused the request as sent"
        )
    return cls(
        f"the model server at {where} answered {label}: {detail}; {advice}",
        status_code=status,
        code=code,
        body=body,
    )


def _message_of(body: object) -> str:
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str):
            return message
        inner = body.get("error")
        if isinstance(inner, dict):
            return _message_of(inner)
        if isinstance(inner, str):
            return inner
    if isinstance(body, str):
        return body[:300]
    return ""


#: Error codes in a 200 answer's body (a proxy passing its upstream's) that may pass.
_TRANSIENT_CODES = frozenset(
    {"rate_limit_exceeded", "server_error", "overloaded", "overloaded_error", "timeout"}
)


def transient_code(code: object) -> bool:
    """Whether an error code carried in an answer's body says the failure may pass.

    429 or 5xx (as a number or its digits), or a rate limit, server error, overload, timeout.
    """
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool):
        return code == 429 or 500 <= code < 600
    return isinstance(code, str) and code.lower() in _TRANSIENT_CODES


def redact_error(err: ModelError, secret: str | None) -> ModelError:
    """`err` with `secret` replaced in its message (and body), in place.

    Every error an attempt raises passes here, whichever layer made it: an answer read as no
    completion echoes whatever the server put in it, the API key included.
    """
    if secret and len(secret) >= 4:
        if err.args and isinstance(err.args[0], str) and secret in err.args[0]:
            err.args = (err.args[0].replace(secret, "[redacted]"), *err.args[1:])
        if isinstance(err, ModelHTTPError):
            err.body = redact(err.body, secret)
    return err


def redact(value: object, secret: str | None) -> object:
    """Return `value` (a JSON-like body or a string) with `secret` replaced everywhere."""
    if not secret or len(secret) < 4:
        return value
    if isinstance(value, str):
        return value.replace(secret, "[redacted]")
    if isinstance(value, dict):
        return {k: redact(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secret) for v in value]
    return value
