"""`OpenAIClient`: the `LLMClient` for every OpenAI-compatible chat-completions server.

Built on the official SDK's `AsyncOpenAI` (connections, HTTP), with what real servers need:

- The request body is built here as plain JSON (each message encoded once while it lives,
  see `encode_body`) and posted through the SDK's lower-level ``post``, skipping its
  per-call transform of typed parameters (see `agent_flow.llm._openai_post`). Streams are
  read as raw chunk dicts.
- Every answer goes through one `Assembler` that normalizes what servers disagree about
  (see `agent_flow.llm._openai_wire`).
- One retry layer, this client's (the SDK's is off), with named timeouts per attempt (see
  `agent_flow.llm._openai_retry`); streams announce each retry with a `RetryNotice`.
- Failures end in a precise `ModelError` subclass (see `agent_flow.llm._openai_errors`): a
  stream that stops without a finish reason raises `IncompleteStreamError`, a connection
  dropped mid-answer `ModelConnectionError`, a corrupt chunk `MalformedChunkError` (all three
  retryable: the attempt is tried again); never a silently truncated answer (a connection
  lost after the finish reason loses only usage).
- Servers that reject ``stream_options`` get the stream requested again without it; servers
  that cannot stream with tools (refusing with an HTTP error, or after an HTTP 200) get a
  non-streamed request (see `agent_flow.llm._openai_stream`), reported as `StreamWarning`s.

The API key is kept out of every repr, log line and exception (server messages that echo it
are redacted).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from types import TracebackType
from typing import TYPE_CHECKING, Literal, cast

import openai
from openai import AsyncOpenAI
from pydantic import SecretStr

from agent_flow._defaults import DEFAULT_MODEL_RETRIES, RETRY_BASE_DELAY
from agent_flow._types import JsonObject, JsonValue
from agent_flow.errors import (
    ConfigError,
    IncompleteStreamError,
    ModelConnectionError,
    ModelError,
    ModelResponseError,
    ModelTimeoutError,
)
from agent_flow.llm._idle_probe import quicken
from agent_flow.llm._openai_body import BodyDefaults, body_fields
from agent_flow.llm._openai_errors import redact_error, translate_error
from agent_flow.llm._openai_post import ChatPost
from agent_flow.llm._openai_retry import RetryPolicy, Timeouts
from agent_flow.llm._openai_stream import (
    STREAM_WITH_TOOLS_UNSUPPORTED,
    WARNINGS,
    StreamClock,
    StreamSupport,
    read_stream,
    refused_in_stream,
)
from agent_flow.llm._openai_wire import Assembler, messages_to_wire
from agent_flow.llm._pool_shards import shard
from agent_flow.llm.base import (
    NATIVE_FORMAT,
    RETRY_LISTENER,
    Completion,
    LLMRequest,
    PromptFormat,
    RetryNotice,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    ToolMode,
)
from agent_flow.llm.xml_tools import XML_FORMAT
from agent_flow.messages import ChatMessage

if TYPE_CHECKING:
    from agent_flow.llm.base import LLMClient
    from agent_flow.llm.config import LLMConfig

__all__ = ["OpenAIClient"]

_NO_KEY_PLACEHOLDER = "no-key-needed"  # local servers ignore the key; the SDK wants one
_DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
_BACKSTOP = 5.0  # seconds the SDK's read timeout lies behind the request timeout
_CHUNKS = (TextChunk, ThinkingChunk, ToolCallChunk, ToolCallArgumentsChunk)


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
        timeout: Seconds one attempt may take in all (default 600).
        connect_timeout: Seconds to wait for a connection (default 10).
        first_byte_timeout: Seconds a streamed answer may take to start (default 120).
        chunk_timeout: Seconds a streamed answer may go silent between chunks (default 60).
        max_retries: Retries of failures that may pass (connection errors, timeouts, 429,
            5xx, cut streams), honouring ``Retry-After``, else after a jittered backoff;
            default 2. This is the only retry layer: the SDK's own is switched off.
        tool_mode: ``"native"`` tool calling, or ``"xml"`` for models without it.
        tool_choice: The ``tool_choice`` sent whenever tools are offered and the request sets
            none (``"auto"``: llama-cpp-python drops the tools of a request without one);
            ``None`` sends none.
        stream_usage: Ask for usage in streamed answers (``stream_options.include_usage``).
        temperature: Default sampling temperature.
        max_tokens: Limit on generated tokens: sent when a request sets none, and caps a
            request's own ``max_tokens``.
        max_tokens_field: The body field for `max_tokens`: ``"max_tokens"`` (widest support)
            or ``"max_completion_tokens"`` (OpenAI's reasoning models need it).
        extra_body: Provider-specific fields merged into every request body.
        sdk_client: A ready `AsyncOpenAI` (e.g. `AsyncAzureOpenAI`) to use instead of
            building one; the connection arguments must then be left unset. It is used as
            it is; one built here checks its idle pooled connections more cheaply
            (`agent_flow.llm._idle_probe`) and splits its pool in shards, so that a
            request's cost does not grow with the runs at once (`agent_flow.llm._pool_shards`).

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
        first_byte_timeout: float | None = None,
        chunk_timeout: float | None = None,
        max_retries: int | None = None,
        tool_mode: ToolMode = "native",
        tool_choice: str | None = "auto",
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
        self.tool_choice = tool_choice or None
        self.stream_usage = stream_usage
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_tokens_field = max_tokens_field
        self.extra_body: JsonObject = dict(extra_body or {})
        self._api_key_env = api_key_env
        self._streaming = StreamSupport()
        defaults = Timeouts()
        self.timeouts = Timeouts(
            connect=connect_timeout or defaults.connect,
            first_byte=first_byte_timeout or defaults.first_byte,
            chunk=chunk_timeout or defaults.chunk,
            request=timeout or defaults.request,
        )
        self.max_retries = DEFAULT_MODEL_RETRIES if max_retries is None else max_retries
        self.retry_base_delay = RETRY_BASE_DELAY
        if sdk_client is not None:
            given = [
                name
                for name, value in (
                    ("base_url", base_url),
                    ("api_key", api_key),
                    ("organization", organization),
                    ("project", project),
                    ("headers", headers),
                    ("connect_timeout", connect_timeout),
                )
                if value is not None
            ]
            if given:
                raise ConfigError(
                    f"sdk_client was given together with {', '.join(given)}; configure those "
                    "on the AsyncOpenAI client instead"
                )
            # One retry layer: this client's. The copy shares the caller's connections.
            self._sdk = sdk_client.with_options(max_retries=0)
            self._owns_sdk = False
            self._post = ChatPost(self._sdk)
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
        # The SDK's read limit is only a backstop behind this client's own timers.
        sdk_timeout = openai.Timeout(
            self.timeouts.request + _BACKSTOP, connect=self.timeouts.connect
        )
        self._sdk = AsyncOpenAI(
            api_key=key,
            base_url=resolved_url,
            organization=organization,
            project=project,
            default_headers=dict(headers) if headers else None,
            timeout=sdk_timeout,
            max_retries=0,
        )
        quicken(self._sdk)
        shard(self._sdk)  # after quicken: the shards share its backend
        self._owns_sdk = True
        self._post = ChatPost(self._sdk)

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
                tool_choice=config.tool_choice,
                stream_usage=config.stream_usage,
                temperature=config.temperature,
                max_tokens=config.max_tokens,
                max_tokens_field=config.resolved_max_tokens_field(),
                extra_body=config.extra_body,
                timeout=config.timeout,
                first_byte_timeout=config.first_byte_timeout,
                chunk_timeout=config.chunk_timeout,
                max_retries=config.max_retries,
                sdk_client=sdk_client,
            )
        return cls(
            config.model,
            base_url=config.resolved_base_url(),
            # A config that sends no key (a client-chosen endpoint) never reads one.
            api_key=None if config.send_key else _NO_KEY_PLACEHOLDER,
            api_key_env=config.resolved_api_key_env(),
            organization=config.organization,
            project=config.project,
            headers=config.headers or None,
            timeout=config.timeout,
            connect_timeout=config.connect_timeout,
            first_byte_timeout=config.first_byte_timeout,
            chunk_timeout=config.chunk_timeout,
            max_retries=config.max_retries,
            tool_mode=config.tool_mode,
            tool_choice=config.tool_choice,
            stream_usage=config.stream_usage,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            max_tokens_field=config.resolved_max_tokens_field(),
            extra_body=config.extra_body,
        )

    # -- identity --------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The API root requests go to, as shown: without user info or query (credentials)."""
        # Read on every call (pricing picks the provider by it): remembered by the poster.
        return self._post.base_url()

    @property
    def sdk_client(self) -> AsyncOpenAI:
        """The underlying `AsyncOpenAI` (for what agent_flow does not wrap)."""
        return self._sdk

    @property
    def prompt_format(self) -> PromptFormat:
        """How prompts go on the wire (XML mode rewrites them); budgets count through it."""
        return XML_FORMAT if self.tool_mode == "xml" else NATIVE_FORMAT

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
        body: JsonObject = {"messages": cast(list[JsonValue], messages_to_wire(messages)), **fields}
        if "tools" in body:
            # A copy of its own: the list `_prepare` gives is shared by every request.
            body["tools"] = copy.deepcopy(body["tools"])
        return body

    def _prepare(
        self, request: LLMRequest, *, stream: bool
    ) -> tuple[Sequence[ChatMessage], JsonObject]:
        """Return the prompt to send and every other body field."""
        # The very rendering the ContextManager counted the prompt with.
        messages, tools = self.prompt_format.render(
            request.messages, request.tools, tool_choice=request.tool_choice
        )
        defaults = BodyDefaults(
            model=self.model,
            tool_choice=self.tool_choice,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            max_tokens_field=self.max_tokens_field,
            extra_body=self.extra_body,
        )
        stream_usage = self.stream_usage and self._streaming.options_accepted
        fields = body_fields(request, tools, defaults, stream=stream, stream_usage=stream_usage)
        return messages, fields

    def _policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_retries, base_delay=self.retry_base_delay)

    async def complete(self, request: LLMRequest) -> Completion:
        """Return the model's whole answer (a non-streamed request), retrying what may pass.

        Each retry is told to the `RETRY_LISTENER` of the calling context, if any.

        Raises:
            ModelError: A precise subclass; see the module docstring. Its ``attempts`` says
                how many attempts were made.
        """
        policy = self._policy()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._complete_once(request)
            except ModelError as err:
                redact_error(err, self._secret.get_secret_value())
                delay = policy.delay(err, attempt)
                if delay is None:
                    raise
                notice = RetryNotice.after(
                    err, attempt=attempt, max_attempts=policy.max_attempts, delay=delay
                )
            if (listener := RETRY_LISTENER.get()) is not None:
                await listener(notice)
            await asyncio.sleep(delay)

    async def _complete_once(self, request: LLMRequest) -> Completion:
        messages, fields = self._prepare(request, stream=False)
        data = await self._post_whole(messages, fields)
        assembler = Assembler(request.messages, xml=self.tool_mode == "xml")
        assembler.feed_response(data)
        _, completion = assembler.finish(require_finish_reason=False)
        return completion

    async def _post_whole(self, messages: Sequence[ChatMessage], fields: JsonObject) -> object:
        """Post a non-streamed request under the request timeout; return the parsed answer."""
        limit = self.timeouts.request
        try:
            async with asyncio.timeout(limit):
                return await self._post.whole(messages, fields)
        except TimeoutError as err:
            # Not retried: the identical request would only run as long again (see
            # StreamClock.timeout_error).
            timed_out = ModelTimeoutError(
                f"the model server at {self.base_url} did not answer within the request "
                f"timeout of {limit:g} s; raise it (--timeout, or timeout in the LLM config)"
            )
            timed_out.retryable = False
            raise timed_out from err
        except openai.OpenAIError as err:
            raise self._translate(err, streaming=False) from err
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ModelResponseError(
                f"the server's answer from {self.base_url} is not valid JSON ({err}); "
                "check the base URL"
            ) from err

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        """Yield the answer as chunks, then the final `Completion`, retrying what may pass.

        A failed attempt that is tried again yields a `RetryNotice`; the chunks yielded
        before it belong to the abandoned attempt and are void.

        Raises:
            ModelError: A precise subclass; see the module docstring. Its ``attempts`` says
                how many attempts were made.
        """
        policy = self._policy()
        attempt = 0
        while True:
            attempt += 1
            streamed = False
            try:
                async with aclosing(self._stream_once(request)) as events:
                    async for event in events:
                        streamed = streamed or isinstance(event, _CHUNKS)
                        yield event
                return
            except ModelError as err:
                redact_error(err, self._secret.get_secret_value())
                delay = policy.delay(err, attempt)
                if delay is None:
                    raise
                notice = RetryNotice.after(
                    err,
                    attempt=attempt,
                    max_attempts=policy.max_attempts,
                    delay=delay,
                    discarded=streamed,
                )
            yield notice
            await asyncio.sleep(delay)

    async def _stream_once(self, request: LLMRequest) -> AsyncGenerator[StreamEvent, None]:
        messages, fields = self._prepare(request, stream=True)
        assembler = Assembler(request.messages, xml=self.tool_mode == "xml")
        clock = StreamClock(
            first_byte=self.timeouts.first_byte,
            chunk=self.timeouts.chunk,
            request=self.timeouts.request,
        )
        codes: list[str] = []
        try:
            when, sentence = clock.next_deadline(first=True)
            async with asyncio.timeout_at(when):
                sdk_stream = await self._streaming.open(
                    lambda body: self._post.stream(messages, body), fields, codes
                )
        except TimeoutError as err:
            raise clock.timeout_error(when, sentence, where=self.base_url) from err
        except openai.OpenAIError as err:
            raise self._translate(err, streaming=False) from err
        for code in codes:
            yield StreamWarning(code=code, message=WARNINGS[code])
        notes = [WARNINGS[code] for code in codes]
        if sdk_stream is None:
            async for event in self._fallback(messages, fields, assembler, notes):
                yield event
            return
        try:
            async with aclosing(
                read_stream(sdk_stream, assembler, notes, where=self.base_url, clock=clock)
            ) as events:
                async for event in events:
                    yield event
        except (openai.OpenAIError, IncompleteStreamError) as err:
            if not refused_in_stream(err, fields, assembler):
                if isinstance(err, IncompleteStreamError):
                    raise
                raise self._translate(err, streaming=True) from err
        else:
            return
        # The server accepted the stream (HTTP 200), then refused it before any chunk:
        # llama-cpp-python does so when tools are offered. Ask again without streaming.
        self._streaming.refuse_stream_with_tools(cast(str, fields["model"]))
        notes.append(warning := WARNINGS[STREAM_WITH_TOOLS_UNSUPPORTED])
        yield StreamWarning(code=STREAM_WITH_TOOLS_UNSUPPORTED, message=warning)
        assembler = Assembler(request.messages, xml=self.tool_mode == "xml")
        async for event in self._fallback(messages, fields, assembler, notes):
            yield event

    async def _fallback(
        self,
        messages: Sequence[ChatMessage],
        fields: JsonObject,
        assembler: Assembler,
        warnings: list[str],
    ) -> AsyncIterator[StreamEvent]:
        plain = {k: v for k, v in fields.items() if k not in ("stream", "stream_options")}
        try:
            data = await self._post_whole(messages, plain)
        except ModelConnectionError:  # a stream refused after HTTP 200 can leave a dead
            data = await self._post_whole(messages, plain)  # pooled connection: once more
        for event in assembler.feed_response(data):
            yield event
        events, completion = assembler.finish(warnings=warnings, require_finish_reason=False)
        for event in events:
            yield event
        yield completion

    # -- errors ----------------------------------------------------------------------------

    def _translate(self, err: openai.OpenAIError, *, streaming: bool) -> ModelError:
        return translate_error(
            err,
            where=self.base_url,
            secret=self._secret.get_secret_value(),
            api_key_env=self._api_key_env,
            streaming=streaming,
            connect_timeout=self.timeouts.connect,
        )


if TYPE_CHECKING:  # mypy checks that the client implements the protocol

    def _implements_protocol(client: OpenAIClient) -> LLMClient:
        return client
