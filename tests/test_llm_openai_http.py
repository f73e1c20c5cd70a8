"""OpenAIClient over HTTP: errors and retries, server quirks, and the requests it sends."""

from __future__ import annotations

import json
import socket

import pytest

from agent_flow import AgentExecutor
from agent_flow.errors import (
    ConfigError,
    ModelAuthenticationError,
    ModelBadRequestError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
)
from agent_flow.events import event_to_json
from agent_flow.llm import (
    Completion,
    LLMRequest,
    OpenAIClient,
    StreamWarning,
    ToolCallChunk,
    final_completion,
)
from agent_flow.messages import ChatMessage, ToolCall
from tests.openai_client_helpers import HELLO, READ_FILE, SECRET, WITH_TOOLS, client, collect, texts
from tests.openai_server import (
    OpenAIServer,
    RecordedRequest,
    Reply,
    completion_body,
    error_reply,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

__all__ = ["client"]  # fixtures

# -- HTTP errors and retries ----------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_429_then_success_is_retried_by_the_sdk_and_succeeds(
    openai_server: OpenAIServer, client: OpenAIClient, streaming: bool
) -> None:
    ok = (
        sse_reply(text_chunks("after the wait"))
        if streaming
        else json_reply(completion_body("after the wait"))
    )
    openai_server.script(error_reply(429, "slow down", code="rate_limit_exceeded"), ok)

    if streaming:
        completion = await final_completion(client.stream(HELLO))
    else:
        completion = await client.complete(HELLO)

    assert completion.text == "after the wait"
    assert len(openai_server.requests) == 2
    # One retry layer: agent_flow's (the SDK's own is off, so it counts no retry).
    assert openai_server.requests[1].headers["x-stainless-retry-count"] == "0"


async def test_a_persistent_429_ends_in_model_rate_limit_error_with_status_code_and_body(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(*[error_reply(429, "slow down", code="rate_limit_exceeded")] * 3)

    with pytest.raises(ModelRateLimitError) as caught:
        await client.complete(HELLO)

    error = caught.value
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert isinstance(error.body, dict)
    assert error.body["message"] == "slow down"
    assert error.retryable
    assert "gave up after 3 attempts" in str(error)
    assert error.attempts == 3
    assert len(openai_server.requests) == 3


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_persistent_500_ends_in_model_server_error_after_the_retries(
    openai_server: OpenAIServer, client: OpenAIClient, streaming: bool
) -> None:
    openai_server.script(
        *[error_reply(500, f"boom {n}", type="server_error", code=None) for n in range(3)]
    )

    attempt = collect(client.stream(HELLO)) if streaming else client.complete(HELLO)

    with pytest.raises(ModelServerError, match="HTTP 500") as caught:
        await attempt

    assert caught.value.status_code == 500
    assert caught.value.code == "server_error"  # the error type stands in for a missing code
    assert len(openai_server.requests) == 3


async def test_a_500_then_success_is_retried_by_the_sdk(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(error_reply(500), sse_reply(text_chunks("fine")))

    assert (await final_completion(client.stream(HELLO))).text == "fine"
    assert len(openai_server.requests) == 2


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, ModelBadRequestError),
        (401, ModelAuthenticationError),
        (403, ModelAuthenticationError),
        (404, ModelBadRequestError),
        (422, ModelBadRequestError),
        (429, ModelRateLimitError),
        (500, ModelServerError),
        (503, ModelServerError),
    ],
)
async def test_each_http_error_status_maps_to_its_agent_flow_error(
    openai_server: OpenAIServer, status: int, error_type: type[ModelError]
) -> None:
    openai_server.script(error_reply(status, f"status {status}", code=f"code_{status}"))
    llm = OpenAIClient("m", base_url=openai_server.base_url, api_key=SECRET, max_retries=0)
    try:
        with pytest.raises(error_type) as caught:
            await llm.complete(HELLO)
    finally:
        await llm.aclose()

    assert type(caught.value) is error_type
    assert caught.value.status_code == status  # type: ignore[attr-defined]
    assert caught.value.code == f"code_{status}"  # type: ignore[attr-defined]
    assert f"status {status}" in str(caught.value)


async def test_client_errors_are_not_retried(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(error_reply(401, "bad key", code="invalid_api_key"), error_reply(400))

    with pytest.raises(ModelAuthenticationError, match="OPENAI_API_KEY"):
        await client.complete(HELLO)
    with pytest.raises(ModelBadRequestError):
        await client.complete(HELLO)

    assert len(openai_server.requests) == 2


async def test_the_api_key_never_appears_in_errors_reprs_or_bodies(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    echo = f"Incorrect API key provided: {SECRET}."
    openai_server.script(error_reply(401, echo, code="invalid_api_key"))

    with pytest.raises(ModelAuthenticationError) as caught:
        await client.complete(HELLO)

    error = caught.value
    assert SECRET not in str(error)
    assert SECRET not in repr(error)
    assert SECRET not in json.dumps(error.body)
    assert "[redacted]" in str(error)
    assert SECRET not in repr(client)
    assert SECRET not in str(vars(client))


async def test_an_unreachable_server_raises_model_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        llm = OpenAIClient("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        try:
            with pytest.raises(ModelConnectionError, match="could not reach"):
                await llm.complete(HELLO)
        finally:
            await llm.aclose()


async def test_a_server_that_does_not_answer_in_time_raises_model_timeout_error(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(Reply(hang=True))
    llm = OpenAIClient(
        "m", base_url=openai_server.base_url, api_key="k", timeout=0.2, max_retries=0
    )
    try:
        with pytest.raises(ModelTimeoutError, match=r"request timeout of 0.2 s"):
            await collect(llm.stream(HELLO))
    finally:
        await llm.aclose()


async def test_a_non_streamed_answer_with_no_choices_raises_model_response_error(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(json_reply({"id": "x", "choices": [], "model": "m"}))

    with pytest.raises(ModelResponseError, match="no choices"):
        await client.complete(HELLO)


# -- server quirks ----------------------------------------------------------------------------


def rejects_stream_options(request: RecordedRequest) -> Reply:
    if "stream_options" in request.body:
        return error_reply(400, "Unrecognized request argument supplied: stream_options")
    return sse_reply(text_chunks("no usage here", usage=None))


async def test_a_server_rejecting_stream_options_is_asked_again_without_them_once(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.script(rejects_stream_options, rejects_stream_options, rejects_stream_options)

    first = await collect(client.stream(HELLO))
    second = await collect(client.stream(HELLO))

    (warning,) = [e for e in first if isinstance(e, StreamWarning)]
    assert warning.code == "stream_options_rejected"
    completion = first[-1]
    assert isinstance(completion, Completion)
    assert completion.text == "no usage here"
    assert completion.warnings == (warning.message,)
    assert completion.usage is None
    assert not any(isinstance(e, StreamWarning) for e in second)
    assert ["stream_options" in body for body in openai_server.bodies] == [True, False, False]


def rejects_stream_with_tools(request: RecordedRequest) -> Reply:
    body = request.body
    if body.get("stream") and body.get("tools"):
        return error_reply(400, "Cannot use tools with stream", retry_after_ms=None)
    return json_reply(
        completion_body("Reading.", tool_calls=[("c1", "read_file", '{"path": "a.py"}')])
    )


async def test_a_server_rejecting_streams_with_tools_falls_back_to_a_non_streamed_call(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    openai_server.handler = rejects_stream_with_tools

    events = await collect(client.stream(WITH_TOOLS))
    again = await collect(client.stream(WITH_TOOLS))

    (warning,) = [e for e in events if isinstance(e, StreamWarning)]
    assert warning.code == "stream_with_tools_unsupported"
    assert texts(events) == "Reading."
    started = [e for e in events if isinstance(e, ToolCallChunk)]
    assert [(s.id, s.name) for s in started] == [("c1", "read_file")]
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.tool_calls[0].parsed_arguments == {"path": "a.py"}
    assert completion.warnings == (warning.message,)
    # The rejection is remembered: the second call went straight to a non-streamed request,
    # and says nothing: the fallback was told once, when it was learned.
    assert [bool(body.get("stream")) for body in openai_server.bodies] == [True, False, False]
    assert not any(isinstance(e, StreamWarning) for e in again)
    assert isinstance(again[-1], Completion)
    assert (again[-1].text, again[-1].warnings) == ("Reading.", ())


# -- requests -------------------------------------------------------------------------------


async def test_neutral_messages_and_settings_are_converted_to_the_wire_format(
    openai_server: OpenAIServer,
) -> None:
    openai_server.script(json_reply(completion_body("ok")))
    llm = OpenAIClient(
        "default-model",
        base_url=openai_server.base_url,
        api_key="k",
        headers={"X-Team": "agents"},
        organization="org-1",
        temperature=0.3,
        max_tokens_field="max_completion_tokens",
        extra_body={"top_k": 5, "seed": 1},
    )
    request = LLMRequest(
        messages=[
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Read a.py", name="ana"),
            ChatMessage(
                role="assistant",
                tool_calls=(ToolCall(id="c1", name="read_file", arguments='{"path":"a.py"}'),),
            ),
            ChatMessage(role="tool", content="print(1)", tool_call_id="c1", name="read_file"),
        ],
        tools=[READ_FILE],
        model="override-model",
        max_tokens=64,
        stop=("END",),
        tool_choice="read_file",
        parallel_tool_calls=False,
        extra_body={"seed": 7},
    )
    try:
        await llm.complete(request)
    finally:
        await llm.aclose()

    recorded = openai_server.requests[0]
    body = recorded.body
    assert recorded.path == "/v1/chat/completions"
    assert body == llm.build_body(request, stream=False)
    assert body["model"] == "override-model"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Read a.py", "name": "ana"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "read_file"}}
    assert body["parallel_tool_calls"] is False
    assert body["temperature"] == 0.3
    assert body["max_completion_tokens"] == 64
    assert "max_tokens" not in body
    assert body["stop"] == ["END"]
    assert body["top_k"] == 5
    assert body["seed"] == 7  # the request's extra_body wins over the client's
    assert "stream" not in body
    assert recorded.headers["x-team"] == "agents"
    assert recorded.headers["openai-organization"] == "org-1"


async def test_the_tool_schemas_are_encoded_once_and_every_request_carries_them(
    openai_server: OpenAIServer,
) -> None:
    from agent_flow.llm import _openai_wire

    openai_server.script(json_reply(completion_body("ok")), json_reply(completion_body("ok")))
    llm = OpenAIClient("m", base_url=openai_server.base_url, api_key="k")
    request = LLMRequest(messages=[ChatMessage(role="user", content="hi")], tools=[READ_FILE])
    encoded = 0
    real_to_json = _openai_wire.to_json

    def counting_to_json(value: object) -> bytes:
        nonlocal encoded
        if isinstance(value, list):  # only the tool list is encoded as a list
            encoded += 1
        return real_to_json(value)

    _openai_wire._tool_lists.clear()
    _openai_wire._tool_lists_json.clear()
    _openai_wire.to_json = counting_to_json  # type: ignore[assignment]
    try:
        inspected = llm.build_body(request, stream=False)
        inspected["tools"][0]["function"]["name"] = "changed by the caller"  # its own copy
        await llm.complete(request)
        await llm.complete(request)
    finally:
        _openai_wire.to_json = real_to_json
        await llm.aclose()

    assert encoded == 1
    first, second = (recorded.body for recorded in openai_server.requests)
    assert first == second == llm.build_body(request, stream=False)
    assert first["tools"][0]["function"]["name"] == "read_file"
    assert first["tools"] == _openai_wire.tools_to_wire([READ_FILE])


async def test_a_non_streamed_answer_is_normalized_like_a_stream(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    body = completion_body(
        "  Let me read both.  ",
        tool_calls=[(None, "read_file", {"path": "a.py"}), (None, "read_file", "")],
        finish_reason="stop",
        usage=(50, 10),
        cached=40,
        reasoning_tokens=3,
        reasoning="First a, then b.",
    )
    openai_server.script(json_reply(body))

    completion = await client.complete(WITH_TOOLS)

    assert completion.text == "Let me read both."
    assert completion.thinking == "First a, then b."
    assert completion.finish_reason == "tool_calls"
    first, second = completion.tool_calls
    assert first.arguments == '{"path": "a.py"}'  # an object instead of a string: serialized
    assert first.parsed_arguments == {"path": "a.py"}
    assert second.arguments == "{}"  # nothing at all: no arguments
    assert second.parsed_arguments == {}
    assert first.id != second.id
    assert completion.usage is not None
    assert (completion.usage.cached_tokens, completion.usage.reasoning_tokens) == (40, 3)


async def test_the_api_key_is_read_from_the_named_environment_variable(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_PROVIDER_KEY", "from-env")
    openai_server.script(json_reply(completion_body("ok")))
    llm = OpenAIClient("m", base_url=openai_server.base_url, api_key_env="MY_PROVIDER_KEY")
    try:
        await llm.complete(HELLO)
    finally:
        await llm.aclose()

    assert openai_server.requests[0].headers["authorization"] == "Bearer from-env"


def test_openai_itself_without_a_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIClient("gpt-4o-mini")


async def test_a_local_server_needs_no_key(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    openai_server.script(json_reply(completion_body("local")))
    llm = OpenAIClient("llama3")
    try:
        assert (await llm.complete(HELLO)).text == "local"
    finally:
        await llm.aclose()
    assert llm.base_url == openai_server.base_url + "/"


async def test_an_azure_sdk_client_is_used_as_given_and_routes_to_the_deployment(
    openai_server: OpenAIServer,
) -> None:
    from openai import AsyncAzureOpenAI

    azure = AsyncAzureOpenAI(
        azure_endpoint=f"http://127.0.0.1:{openai_server.port}",
        api_key="azure-key",
        api_version="2024-10-21",
        max_retries=0,
    )
    openai_server.script(sse_reply(text_chunks("from azure")))
    llm = OpenAIClient("my-deployment", sdk_client=azure)
    try:
        completion = await final_completion(llm.stream(HELLO))
    finally:
        await azure.close()

    assert completion.text == "from azure"
    recorded = openai_server.requests[0]
    assert recorded.path.startswith("/openai/deployments/my-deployment/chat/completions")
    assert recorded.headers["api-key"] == "azure-key"
    assert recorded.body["messages"] == [{"role": "user", "content": "hi"}]


def test_an_sdk_client_cannot_be_combined_with_connection_arguments() -> None:
    from openai import AsyncOpenAI

    with pytest.raises(ConfigError, match="sdk_client was given together with base_url"):
        OpenAIClient("m", sdk_client=AsyncOpenAI(api_key="k"), base_url="http://x/v1")


async def test_a_connection_lost_after_the_finish_reason_keeps_the_complete_answer(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunks = text_chunks("complete answer")
    openai_server.script(sse_reply(chunks, drop_after=len(chunks) - 1))  # usage and [DONE] lost

    events = await collect(client.stream(HELLO))

    (warning,) = [e for e in events if isinstance(e, StreamWarning)]
    assert warning.code == "connection_lost_after_answer"
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert completion.text == "complete answer"
    assert completion.usage is None
    assert completion.warnings == (warning.message,)


async def test_whole_tool_calls_without_index_or_id_are_kept_apart(
    openai_server: OpenAIServer, client: OpenAIClient
) -> None:
    chunks = tool_call_chunks(
        [(None, "read_file", '{"path": "a.py"}'), (None, "list_dir", "{}")],
        chunk_size=100,
        with_index=False,
    )
    openai_server.script(sse_reply(chunks))

    completion = await final_completion(client.stream(WITH_TOOLS))

    assert [(c.name, c.parsed_arguments) for c in completion.tool_calls] == [
        ("read_file", {"path": "a.py"}),
        ("list_dir", {}),
    ]
    assert len({c.id for c in completion.tool_calls}) == 2


async def test_base_url_follows_the_sdk_clients_url_when_it_is_changed() -> None:
    llm = OpenAIClient("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    try:
        assert llm.base_url == "http://127.0.0.1:9/v1/"
        assert llm.base_url == "http://127.0.0.1:9/v1/"  # read again: the same text
        llm.sdk_client.base_url = "http://127.0.0.1:10/v2"
        assert llm.base_url == "http://127.0.0.1:10/v2/"
    finally:
        await llm.aclose()


async def test_requests_go_to_the_sdk_clients_url_whole_and_streamed_when_it_changes() -> None:
    async with OpenAIServer() as first, OpenAIServer() as second:
        first.script(json_reply(completion_body("one")))
        second.script(json_reply(completion_body("two")), sse_reply(text_chunks("three")))
        llm = OpenAIClient("m", base_url=first.base_url, api_key="k")
        try:
            assert (await llm.complete(HELLO)).text == "one"
            # Another server, and a path prefix of its own (a proxy's, say).
            llm.sdk_client.base_url = second.base_url.replace("/v1", "/proxy/v2")
            assert (await llm.complete(HELLO)).text == "two"
            assert texts(await collect(llm.stream(HELLO))) == "three"
        finally:
            await llm.aclose()
    assert [r.path for r in first.requests] == ["/v1/chat/completions"]
    assert [r.path for r in second.requests] == ["/proxy/v2/chat/completions"] * 2


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": f"Incorrect API key provided: {SECRET}.", "code": 401}},
        {"detail": f"echoing {SECRET}"},
        f"not an object: {SECRET}",
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_the_api_key_echoed_in_a_200_answer_never_reaches_the_error(
    openai_server: OpenAIServer, client: OpenAIClient, body: object, stream: bool
) -> None:
    """An answer of HTTP 200 that is no completion was reported with its body: whatever the
    server (a proxy, say) put there, the API key included, went into the run's error, its
    events and the stored session."""
    openai_server.script(json_reply(body))
    answer = collect(client.stream(HELLO)) if stream else client.complete(HELLO)
    with pytest.raises(ModelResponseError) as caught:
        await answer
    assert SECRET not in str(caught.value)
    assert "[redacted]" in str(caught.value)
    if isinstance(body, dict) and "error" in body:  # a proxy's upstream error, said as one
        assert "answered with an error instead of a completion (401)" in str(caught.value)


async def test_credentials_in_the_base_url_reach_the_server_but_no_event_or_error(
    openai_server: OpenAIServer,
) -> None:
    """A proxy's credentials in the base URL (its user info) went into RunStarted's `base_url`
    (to every SSE client of the service) and into every error naming the server."""
    host = openai_server.base_url.removeprefix("http://")
    url = f"http://proxy-user:{SECRET}@{host}"
    openai_server.script(json_reply(completion_body("hello")), json_reply({"nothing": 1}))
    llm = OpenAIClient("m", base_url=url, api_key="k", max_retries=0)
    try:
        agent = AgentExecutor(llm)
        async with agent.subscribe() as events:
            outcome = await agent.run("hi")
            seen = [event async for event in events]
        with pytest.raises(ModelResponseError) as caught:
            await llm.complete(HELLO)
    finally:
        await llm.aclose()
    assert outcome.final_text == "hello"
    # The credentials went where the operator put them: httpx sends user info as Basic auth.
    assert openai_server.requests[0].headers["authorization"].startswith("Basic ")
    assert llm.base_url == f"{openai_server.base_url}/"
    started = next(e for e in seen if e.kind == "run_started")
    assert started.base_url == f"{openai_server.base_url}/"
    assert SECRET not in "".join(event_to_json(e) for e in seen)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(("code", "tried"), [(502, 2), ("429", 2), ("server_error", 2), (400, 1)])
async def test_an_upstream_failure_a_proxy_answers_with_200_is_tried_again_when_it_may_pass(
    openai_server: OpenAIServer, client: OpenAIClient, code: object, tried: int
) -> None:
    """OpenRouter and LiteLLM may pass an upstream's 429 or 5xx as an error object in an HTTP
    200 answer: such an answer was final; now it is tried again as the HTTP status would be."""
    failed = json_reply({"error": {"message": "upstream overloaded", "code": code}})
    openai_server.script(failed, json_reply(completion_body("after all")))
    if tried == 2:
        completion = await client.complete(HELLO)
        assert completion.text == "after all"
    else:
        with pytest.raises(ModelResponseError, match="upstream overloaded"):
            await client.complete(HELLO)
    assert len(openai_server.requests) == tried
