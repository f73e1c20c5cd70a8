"""`OpenAIClient`: the `LLMClient` for every OpenAI-compatible chat-completions server.

Built on the official SDK's `AsyncOpenAI`, so connection handling, timeouts, retries with
backoff and ``Retry-After`` are the SDK's. What this module adds is what real servers need:

- The request body is built here from the neutral messages as plain JSON (each message
  encoded once while it lives, see `encode_body`) and posted through the SDK's lower-level
  ``post`` (its escape hatch for raw bodies), which skips the SDK's per-call transform of
  typed parameters: the cost of a call barely grows with the length of the history.
  Streams are read as raw chunk dicts.
- Every answer goes through one `Assembler` that normalizes what servers disagree about (see
  `agent_flow.llm._openai_wire`).
- Failures end in a precise `ModelError` subclass: HTTP errors (after the SDK's retries)
  carry status, provider code and body; a stream that stops without a finish reason raises
  `IncompleteStreamError`, a connection dropped mid-answer `ModelConnectionError`, a
  corrupt chunk `MalformedChunkError` — never a silently truncated answer. (A connection
  lost after the finish reason arrived loses only usage: the answer is returned, with a
  warning.)
- Servers that reject ``stream_options`` get the stream requested again without it (once;
  remembered); servers that cannot stream with tools get a non-streamed request for that
  call. Both are reported as `StreamWarning` deltas and in `Completion.warnings`.

The API key is kept out of every repr, log line and exception (server messages that echo it
are redacted).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Literal, cast

import openai
from openai import AsyncOpenAI, AsyncStream
from pydantic import SecretStr

from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import (
    ConfigError,
    MalformedChunkError,
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
from agent_flow.llm._openai_wire import (
    Assembler,
    encode_body,
    messages_to_wire,
    redact,
    tool_choice_to_wire,
    tools_to_wire,
)
from agent_flow.llm.base import Completion, LLMRequest, StreamEvent, StreamWarning, ToolMode
from agent_flow.llm.xml_tools import to_xml_messages
from agent_flow.messages import ChatMessage

if TYPE_CHECKING:
    from openai import RequestOptions

    from agent_flow.llm.base import LLMClient
    from agent_flow.llm.config import LLMConfig

__all__ = ["OpenAIClient"]

_PATH = "/chat/completions"
_NO_KEY_PLACEHOLDER = "no-key-needed"  # local servers ignore the key; the SDK wants one
_DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"

STREAM_OPTIONS_REJECTED = "stream_options_rejected"
STREAM_WITH_TOOLS_UNSUPPORTED = "stream_with_tools_unsupported"
CONNECTION_LOST_AFTER_ANSWER = "connection_lost_after_answer"

_WARNINGS = {
    STREAM_OPTIONS_REJECTED: (
        "the server rejected stream_options, so the stream was requested again without it; "
        "token usage may be missing from streamed answers"
    ),
    STREAM_WITH_TOOLS_UNSUPPORTED: (
        "the server cannot stream an answer when tools are offered, so this answer was "
        "requested without streaming"
    ),
    CONNECTION_LOST_AFTER_ANSWER: (
        "the connection closed after the answer was complete but before the stream ended; "
        "token usage may be missing"
    ),
}


class _StreamWithToolsRejected(Exception):
    """Internal: the server refused ``stream`` together with ``tools``."""


def _error_text(err: openai.APIStatusError) -> str:
    try:
        body = json.dumps(err.body, default=str)
    except (TypeError, ValueError):
        body = str(err.body)
    return f"{err.message} {body}".lower()


def _rejects_stream_options(err: openai.APIStatusError) -> bool:
    text = _error_text(err)
    return err.status_code in (400, 422) and ("stream_options" in text or "include_usage" in text)


def _rejects_stream_with_tools(err: openai.APIStatusError) -> bool:
    text = _error_text(err)
    return (
        err.status_code in (400, 422, 500, 501)
        and "stream" in text
        and ("tool" in text or "function" in text)
    )


class OpenAIClient:
    """An `LLMClient` for OpenAI and every server that speaks its chat-completions API.

    OpenAI, Azure OpenAI (``https://<resource>.openai.azure.com/openai/v1/``), Gemini's
    OpenAI-compatible endpoint, Ollama, vLLM, llama.cpp's server, LM Studio and proxies.

    Args:
        model: The model name sent with every request (a request may override it).
        base_url: The API root, e.g. ``http://localhost:11434/v1``; default ``OPENAI_BASE_URL``
            or OpenAI's.
        api_key: The key; default: the variable named by `api_key_env`. Local servers
            (any `base_url`) work without one.
        api_key_env: The environment variable holding the key.
        organization: OpenAI organization (default ``OPENAI_ORG_ID``).
        project: OpenAI project (default ``OPENAI_PROJECT_ID``).
        headers: Extra headers sent with every request.
        timeout: Seconds the SDK waits for the server (per request, and per chunk while
            streaming); default the SDK's 600 s.
        connect_timeout: Seconds to wait for a connection (default ``min(timeout, 5)``).
        max_retries: Retries of connection errors, 408/409/429/5xx (honouring
            ``Retry-After``) before an error is raised; default the SDK's 2.
        tool_mode: ``"native"`` tool calling, or ``"xml"`` for models without it.
        stream_usage: Ask for usage in streamed answers (``stream_options.include_usage``).
        temperature: Default sampling temperature.
        max_tokens: Default limit on generated tokens.
        max_tokens_field: The body field for `max_tokens`: ``"max_tokens"`` (widest support)
            or ``"max_completion_tokens"`` (OpenAI's reasoning models need it).
        extra_body: Provider-specific fields merged into every request body.
        sdk_client: A ready `AsyncOpenAI` (e.g. `AsyncAzureOpenAI`) to use instead of
            building one; the connection arguments must then be left unset.

    Raises:
        ConfigError: No API key was found for OpenAI's own endpoint, or `sdk_client` was
            combined with connection arguments.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        api_key_env: str = _DEFAULT_API_KEY_ENV,
        organization: str | None = None,
        project: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        max_retries: int | None = None,
        tool_mode: ToolMode = "native",
        stream_usage: bool = True,
        temperature: float | None = None,
        max_tokens: int | None = None,
        max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
        extra_body: Mapping[str, JsonValue] | None = None,
        sdk_client: AsyncOpenAI | None = None,
    ) -> None:
        if not model:
            raise ConfigError("the model name is empty; pass the model the server should run")
        self.model = model
        self.tool_mode: ToolMode = tool_mode
        self.stream_usage = stream_usage
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_tokens_field = max_tokens_field
        self.extra_body: JsonObject = dict(extra_body or {})
        self._api_key_env = api_key_env
        self._stream_options_ok = True
        self._no_stream_with_tools: set[str] = set()
        if sdk_client is not None:
            given = [
                name
                for name, value in (
                    ("base_url", base_url),
                    ("api_key", api_key),
                    ("organization", organization),
                    ("project", project),
                    ("headers", headers),
                    ("timeout", timeout),
                    ("connect_timeout", connect_timeout),
                    ("max_retries", max_retries),
                )
                if value is not None
            ]
            if given:
                raise ConfigError(
                    f"sdk_client was given together with {', '.join(given)}; configure those "
                    "on the AsyncOpenAI client instead"
                )
            self._sdk = sdk_client
            self._owns_sdk = False
            # Pre-encoded bodies only for the plain client: subclasses (Azure deployments)
            # read fields of the body to build the URL.
            self._encode_bytes = type(sdk_client) is AsyncOpenAI
            self._secret = SecretStr(sdk_client.api_key or "")
            return
        resolved_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if not key:
            key = os.environ.get(api_key_env) or None
        if not key:
            if resolved_url is None:
                raise ConfigError(
                    f"no API key for OpenAI: the environment variable {api_key_env} is not set; "
                    "set it, pass api_key=..., or point base_url at a local server"
                )
            key = _NO_KEY_PLACEHOLDER
        self._secret = SecretStr(key)
        sdk_timeout: openai.Timeout | openai.NotGiven = openai.NOT_GIVEN
        if timeout is not None or connect_timeout is not None:
            total = 600.0 if timeout is None else timeout
            connect = connect_timeout if connect_timeout is not None else min(total, 5.0)
            sdk_timeout = openai.Timeout(total, connect=connect)
        self._sdk = AsyncOpenAI(
            api_key=key,
            base_url=resolved_url,
            organization=organization,
            project=project,
            default_headers=dict(headers) if headers else None,
            timeout=sdk_timeout,
            max_retries=openai.DEFAULT_MAX_RETRIES if max_retries is None else max_retries,
        )
        self._owns_sdk = True
        self._encode_bytes = True

    @classmethod
    def from_config(
        cls, config: LLMConfig, *, sdk_client: AsyncOpenAI | None = None
    ) -> OpenAIClient:
        """Build a client from an `LLMConfig` (its provider defaults applied).

        Args:
            config: The resolved configuration (see `LLMConfig.with_overrides`).
            sdk_client: Optional ready SDK client, as in the constructor.
        """
        if sdk_client is not None:
            return cls(
                config.model,
                tool_mode=config.tool_mode,
                stream_usage=config.stream_usage,
                temperature=config.temperature,
                max_tokens=config.max_tokens,
                max_tokens_field=config.resolved_max_tokens_field(),
                extra_body=config.extra_body,
                sdk_client=sdk_client,
            )
        return cls(
            config.model,
            base_url=config.resolved_base_url(),
            api_key_env=config.resolved_api_key_env(),
            organization=config.organization,
            project=config.project,
            headers=config.headers or None,
            timeout=config.timeout,
            connect_timeout=config.connect_timeout,
            max_retries=config.max_retries,
            tool_mode=config.tool_mode,
            stream_usage=config.stream_usage,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            max_tokens_field=config.resolved_max_tokens_field(),
            extra_body=config.extra_body,
        )

    # -- identity --------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The API root requests go to."""
        return str(self._sdk.base_url)

    @property
    def sdk_client(self) -> AsyncOpenAI:
        """The underlying `AsyncOpenAI` (for what agent_flow does not wrap)."""
        return self._sdk

    def __repr__(self) -> str:
        return (
            f"OpenAIClient(model={self.model!r}, base_url={self.base_url!r}, "
            f"tool_mode={self.tool_mode!r})"
        )

    async def aclose(self) -> None:
        """Close the HTTP connections (only those of an SDK client this object built)."""
        if self._owns_sdk:
            await self._sdk.close()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- requests --------------------------------------------------------------------------

    def build_body(self, request: LLMRequest, *, stream: bool) -> JsonObject:
        """Return the JSON body this client sends for `request`, as a dict (for inspection).

        Args:
            request: The neutral request.
            stream: Whether the body asks for a streamed answer.
        """
        messages, fields = self._prepare(request, stream=stream)
        return {"messages": cast(list[JsonValue], messages_to_wire(messages)), **fields}

    def _prepare(
        self, request: LLMRequest, *, stream: bool
    ) -> tuple[Sequence[ChatMessage], JsonObject]:
        """Return the prompt to send and every other body field."""
        xml = self.tool_mode == "xml"
        messages: Sequence[ChatMessage] = (
            to_xml_messages(request.messages, request.tools, tool_choice=request.tool_choice)
            if xml
            else request.messages
        )
        fields: JsonObject = {"model": request.model or self.model}
        if stream:
            fields["stream"] = True
            if self.stream_usage and self._stream_options_ok:
                fields["stream_options"] = {"include_usage": True}
        if request.tools and not xml:
            fields["tools"] = cast(list[JsonValue], tools_to_wire(request.tools))
            if request.tool_choice is not None:
                fields["tool_choice"] = tool_choice_to_wire(request.tool_choice)
            if request.parallel_tool_calls is not None:
                fields["parallel_tool_calls"] = request.parallel_tool_calls
        temperature = request.temperature if request.temperature is not None else self.temperature
        if temperature is not None:
            fields["temperature"] = temperature
        if request.top_p is not None:
            fields["top_p"] = request.top_p
        max_tokens = request.max_tokens if request.max_tokens is not None else self.max_tokens
        if max_tokens is not None:
            fields[self.max_tokens_field] = max_tokens
        if request.stop:
            fields["stop"] = list(request.stop)
        if request.seed is not None:
            fields["seed"] = request.seed
        if request.response_format is not None:
            fields["response_format"] = request.response_format
        if self.extra_body:
            fields.update(self.extra_body)
        if request.extra_body:
            fields.update(request.extra_body)
        return messages, fields

    def _options(self) -> RequestOptions:
        return {"security": {"bearer_auth": True}}

    async def _post_json(self, messages: Sequence[ChatMessage], fields: JsonObject) -> object:
        if self._encode_bytes:
            return await self._sdk.post(
                _PATH,
                cast_to=object,
                content=encode_body(messages, fields),
                options=self._options(),
            )
        return await self._sdk.post(
            _PATH,
            cast_to=object,
            body={"messages": messages_to_wire(messages), **fields},
            options=self._options(),
        )

    async def _post_stream(
        self, messages: Sequence[ChatMessage], fields: JsonObject
    ) -> AsyncStream[object]:
        if self._encode_bytes:
            return await self._sdk.post(
                _PATH,
                cast_to=object,
                content=encode_body(messages, fields),
                options=self._options(),
                stream=True,
                stream_cls=AsyncStream[object],
            )
        # SDK subclasses such as AsyncAzureOpenAI route on the body's fields: give them a dict.
        return await self._sdk.post(
            _PATH,
            cast_to=object,
            body={"messages": messages_to_wire(messages), **fields},
            options=self._options(),
            stream=True,
            stream_cls=AsyncStream[object],
        )

    async def complete(self, request: LLMRequest) -> Completion:
        """Return the model's whole answer (a non-streamed request).

        Raises:
            ModelError: A precise subclass; see the module docstring.
        """
        messages, fields = self._prepare(request, stream=False)
        try:
            data = await self._post_json(messages, fields)
        except openai.OpenAIError as err:
            raise self._translate(err, streaming=False) from err
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ModelResponseError(
                f"the server's answer from {self.base_url} is not valid JSON ({err}); "
                "check the base URL"
            ) from err
        assembler = Assembler(request.messages, xml=self.tool_mode == "xml")
        assembler.feed_response(data)
        _, completion = assembler.finish(require_finish_reason=False)
        return completion

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        """Yield the answer as deltas, then the final `Completion`.

        Raises:
            ModelError: A precise subclass; see the module docstring.
        """
        messages, fields = self._prepare(request, stream=True)
        assembler = Assembler(request.messages, xml=self.tool_mode == "xml")
        codes: list[str] = []
        sdk_stream: AsyncStream[object] | None = None
        if "tools" in fields and fields["model"] in self._no_stream_with_tools:
            codes.append(STREAM_WITH_TOOLS_UNSUPPORTED)
        else:
            try:
                sdk_stream = await self._open_stream(messages, fields, codes)
            except _StreamWithToolsRejected:
                self._no_stream_with_tools.add(cast(str, fields["model"]))
                codes.append(STREAM_WITH_TOOLS_UNSUPPORTED)
            except openai.OpenAIError as err:
                raise self._translate(err, streaming=False) from err
        for code in codes:
            yield StreamWarning(code=code, message=_WARNINGS[code])
        notes = [_WARNINGS[code] for code in codes]
        if sdk_stream is None:
            async for event in self._fallback(messages, fields, assembler, notes):
                yield event
            return
        try:
            content_type = sdk_stream.response.headers.get("content-type", "")
            if content_type.startswith("application/json"):
                # The server ignored "stream": read its whole answer instead.
                data = json.loads(await sdk_stream.response.aread())
                for event in assembler.feed_response(data):
                    yield event
                events, completion = assembler.finish(warnings=notes, require_finish_reason=False)
            else:
                try:
                    async for chunk in sdk_stream:
                        for event in assembler.feed(chunk):
                            yield event
                except openai.APIConnectionError:
                    if not assembler.finished:
                        raise
                    # The answer was complete (it had its finish reason); only the stream's
                    # tail (usage, [DONE]) was lost, as with proxies that cut the connection.
                    notes.append(_WARNINGS[CONNECTION_LOST_AFTER_ANSWER])
                    yield StreamWarning(
                        code=CONNECTION_LOST_AFTER_ANSWER,
                        message=_WARNINGS[CONNECTION_LOST_AFTER_ANSWER],
                    )
                events, completion = assembler.finish(warnings=notes)
        except openai.OpenAIError as err:
            raise self._translate(err, streaming=True) from err
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise MalformedChunkError(
                f"chunk {assembler.chunks + 1} of the stream from {self.base_url} is not valid "
                f"JSON ({_excerpt(err)}); the answer cannot be trusted"
            ) from err
        finally:
            await sdk_stream.close()
        for event in events:
            yield event
        yield completion

    async def _open_stream(
        self, messages: Sequence[ChatMessage], fields: JsonObject, codes: list[str]
    ) -> AsyncStream[object]:
        try:
            return await self._post_stream(messages, fields)
        except openai.APIStatusError as err:
            if "stream_options" in fields and _rejects_stream_options(err):
                pass
            elif "tools" in fields and _rejects_stream_with_tools(err):
                raise _StreamWithToolsRejected from err
            else:
                raise
        # Once per client: every later stream is sent without the option.
        self._stream_options_ok = False
        del fields["stream_options"]
        codes.append(STREAM_OPTIONS_REJECTED)
        try:
            return await self._post_stream(messages, fields)
        except openai.APIStatusError as err:
            if "tools" in fields and _rejects_stream_with_tools(err):
                raise _StreamWithToolsRejected from err
            raise

    async def _fallback(
        self,
        messages: Sequence[ChatMessage],
        fields: JsonObject,
        assembler: Assembler,
        warnings: list[str],
    ) -> AsyncIterator[StreamEvent]:
        plain = {k: v for k, v in fields.items() if k not in ("stream", "stream_options")}
        try:
            data = await self._post_json(messages, plain)
        except openai.OpenAIError as err:
            raise self._translate(err, streaming=False) from err
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ModelResponseError(
                f"the server's answer from {self.base_url} is not valid JSON ({err})"
            ) from err
        for event in assembler.feed_response(data):
            yield event
        events, completion = assembler.finish(warnings=warnings, require_finish_reason=False)
        for event in events:
            yield event
        yield completion

    # -- errors ----------------------------------------------------------------------------

    def _translate(self, err: openai.OpenAIError, *, streaming: bool) -> ModelError:
        secret = self._secret.get_secret_value()
        where = self.base_url
        if isinstance(err, openai.APIStatusError):
            return self._status_error(err, secret)
        if isinstance(err, openai.APITimeoutError):
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
            return ModelResponseError(
                f"the model server at {where} reported an error mid-answer"
                f"{f' ({code})' if code else ''}: {redact(err.message, secret)}"
            )
        return ModelError(f"the model call to {where} failed: {redact(str(err), secret)}")

    def _status_error(self, err: openai.APIStatusError, secret: str) -> ModelHTTPError:
        status = err.status_code
        body = redact(err.body, secret)
        code = err.code
        if code is None and isinstance(body, dict):
            kind = body.get("type")
            code = kind if isinstance(kind, str) else None
        detail = _message_of(body) or str(redact(err.message, secret))
        label = f"HTTP {status}" + (f" ({code})" if code else "")
        retried = f" after {self._sdk.max_retries} retries" if self._sdk.max_retries else ""
        cls: type[ModelHTTPError]
        if status in (401, 403):
            cls = ModelAuthenticationError
            advice = f"check the API key (environment variable {self._api_key_env})"
        elif status == 429:
            cls = ModelRateLimitError
            advice = f"the server is rate limiting{retried}; wait or lower the request rate"
        elif status >= 500:
            cls = ModelServerError
            advice = f"the server kept failing{retried}; retry later"
        else:
            cls = ModelBadRequestError
            advice = (
                "check the model name and base URL"
                if status == 404
                else "the server refused the request as sent"
            )
        return cls(
            f"the model server at {self.base_url} answered {label}: {detail}; {advice}",
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


def _excerpt(err: json.JSONDecodeError | UnicodeDecodeError) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg}: {err.doc[:120]!r}"
    return str(err)


if TYPE_CHECKING:  # mypy checks that the client implements the protocol

    def _implements_protocol(client: OpenAIClient) -> LLMClient:
        return client
