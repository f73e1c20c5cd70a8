"""How an `OpenAIClient` posts a chat-completions request through the SDK.

Private to `agent_flow.llm`. `ChatPost` sends a request's messages and body fields with the
SDK's lower-level ``post`` (skipping its per-call transform of typed parameters): for the
plain `AsyncOpenAI`, as bytes encoded here (`encode_body`), to the completions URL in full;
for SDK subclasses that route on the body's fields (`AsyncAzureOpenAI` deployments), as a
dict to the path, as the SDK's own methods do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import openai
from openai import AsyncOpenAI, AsyncStream

from agent_flow._types import JsonObject
from agent_flow.llm._openai_wire import encode_body, messages_to_wire
from agent_flow.messages import ChatMessage

if TYPE_CHECKING:
    from openai import RequestOptions

__all__ = ["PATH", "ChatPost"]

PATH = "/chat/completions"
_NOT_GIVEN: Any = openai.NOT_GIVEN  # RequestOptions' types leave the sentinel out


def _options() -> RequestOptions:
    # Every option the SDK would otherwise fill with a default: it deep-copies each default
    # it fills in, and copying its `NotGiven` sentinels costs ~9 us a request. `NOT_GIVEN`
    # is the SDK's own "not given": the request is the same either way.
    return {
        "security": {"bearer_auth": True},
        "headers": _NOT_GIVEN,
        "max_retries": _NOT_GIVEN,
        "timeout": _NOT_GIVEN,
    }


class ChatPost:
    """Posts chat-completions requests through one SDK client (see the module).

    Args:
        sdk: The SDK client, its retries off (the `OpenAIClient` retries).
    """

    def __init__(self, sdk: AsyncOpenAI) -> None:
        self._sdk = sdk
        # Pre-encoded bodies only for the plain client: subclasses (Azure deployments) read
        # fields of the body to build the URL.
        self._encode_bytes = type(sdk) is AsyncOpenAI
        #: The SDK's `base_url` object, it as text, and the completions URL on it.
        self._urls: tuple[object, str, str] | None = None

    def _known_urls(self) -> tuple[object, str, str]:
        base = self._sdk.base_url
        known = self._urls
        if known is None or known[0] is not base:
            joined = base.copy_with(raw_path=base.raw_path + PATH.lstrip("/").encode())
            shown = base.copy_with(username=None, password=None, query=None)
            known = self._urls = (base, str(shown), str(joined))
        return known

    def base_url(self) -> str:
        """The SDK's `base_url` as text for events, errors and pricing, without credentials.

        Its user info and query are left out (a proxy's credentials may be there); requests go
        to the SDK's own URL, credentials and all. Rendering it is the costly part: remembered.
        """
        return self._known_urls()[1]

    def url(self) -> str:
        """The completions URL in full: the path on the SDK's `base_url`, joined as it joins it.

        Given a path, the SDK parses it and makes a copy of its base URL with the path
        joined on every request (~14 us); given this URL it parses it alone. Both texts are
        made again when the SDK's `base_url` is replaced (the object, not its text, is
        compared).
        """
        return self._known_urls()[2]

    async def whole(self, messages: Sequence[ChatMessage], fields: JsonObject) -> object:
        """Post a request for a whole answer; return the parsed JSON."""
        return await self._post(messages, fields, stream=False)

    async def stream(
        self, messages: Sequence[ChatMessage], fields: JsonObject
    ) -> AsyncStream[object]:
        """Post a request for a streamed answer; return the SDK's stream of chunk dicts."""
        return cast(AsyncStream[object], await self._post(messages, fields, stream=True))

    async def _post(
        self, messages: Sequence[ChatMessage], fields: JsonObject, *, stream: bool
    ) -> object:
        post: Any = self._sdk.post  # one call for both answers (its overloads split on stream)
        body: dict[str, object]
        if self._encode_bytes:
            url, body = self.url(), {"content": encode_body(messages, fields)}
        else:
            url, body = PATH, {"body": {"messages": messages_to_wire(messages), **fields}}
        return await post(
            url,
            cast_to=object,
            options=_options(),
            stream=stream,
            stream_cls=AsyncStream[object] if stream else None,
            **body,
        )
