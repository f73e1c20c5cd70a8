"""What a local model server says its context holds, so a run's budget never exceeds it.

A llama.cpp server started with ``--ctx-size 8192`` answers prompts of at most 8,192 tokens
(prompt and answer together); Ollama silently cuts a prompt longer than its ``num_ctx``. Run
with the default budget (32,000 tokens) against either, an agent would send prompts the server
rejects or truncates. `server_context` asks the server behind an `OpenAIClient`, through that
client's own connection and key (so nothing goes anywhere the operator did not point it):

- llama.cpp: ``GET /props``, ``default_generation_settings.n_ctx`` (per slot);
- vLLM: ``GET {base_url}/models``, the model's ``max_model_len``;
- Ollama: ``GET /api/ps``, the loaded model's ``context_length``, else ``POST /api/show``,
  its ``num_ctx`` parameter.

Only servers that may be such a server are asked: the providers ``llamacpp``, ``ollama``,
``vllm`` and ``lmstudio``, and any OpenAI-compatible endpoint on this machine or a private
network; never OpenAI, Azure or Gemini. A server that says nothing (an error, no such route,
no answer in time) leaves the budget as it is.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai

from agent_flow._defaults import SERVER_CONTEXT_PROBE_SECONDS
from agent_flow.llm import OpenAIClient

__all__ = ["ServerContext", "server_context", "worth_asking"]

_LOCAL_PROVIDERS = frozenset({"llamacpp", "ollama", "vllm", "lmstudio"})
_CLOUD_PROVIDERS = frozenset({"openai", "azure", "gemini"})
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.M)


@dataclass(frozen=True, slots=True)
class ServerContext:
    """The context size a server reported.

    Attributes:
        tokens: How many tokens one request may hold (prompt and answer).
        source: Who said so, for the warning (``llama.cpp /props``).
    """

    tokens: int
    source: str


def worth_asking(provider: str | None, base_url: str | None) -> bool:
    """Whether the server at `base_url` may report its context size (see the module doc)."""
    if provider in _LOCAL_PROVIDERS:
        return True
    if provider in _CLOUD_PROVIDERS or base_url is None:
        return False
    host = urlsplit(base_url).hostname or ""
    if host == "localhost" or host.endswith((".local", ".localhost", ".internal")):
        return True
    if "." not in host and ":" not in host:
        return bool(host)  # a bare name: a container or a machine on the local network
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def _root(base_url: str) -> str:
    """The server's root: the base URL without its ``/v1`` (where /props and /api live)."""
    base = base_url.rstrip("/")
    return base.removesuffix("/v1")


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _llama_cpp(answer: object) -> int | None:
    if not isinstance(answer, dict):
        return None
    settings = answer.get("default_generation_settings")
    if isinstance(settings, dict) and _positive(settings.get("n_ctx")):
        return _positive(settings.get("n_ctx"))
    return _positive(answer.get("n_ctx"))


def _named(model: str) -> set[str]:
    """The names a server may list `model` under (Ollama adds ``:latest``)."""
    return {model, f"{model}:latest"} if ":" not in model else {model}


def _listed(answer: object, key: str, field: str, model: str) -> int | None:
    """`field` of `model`'s entry in the list `key` of `answer` (the only entry will do)."""
    if not isinstance(answer, dict) or not isinstance(answer.get(key), list):
        return None
    entries = [e for e in answer[key] if isinstance(e, dict)]
    names = _named(model)
    mine = [e for e in entries if {e.get("id"), e.get("name"), e.get("model")} & names]
    chosen = mine or (entries if len(entries) == 1 else [])
    return _positive(chosen[0].get(field)) if chosen else None


def _ollama_show(answer: object) -> int | None:
    if not isinstance(answer, dict):
        return None
    parameters = answer.get("parameters")
    found = _NUM_CTX.search(parameters) if isinstance(parameters, str) else None
    return _positive(int(found.group(1))) if found else None


async def server_context(
    client: OpenAIClient, *, within: float = SERVER_CONTEXT_PROBE_SECONDS
) -> ServerContext | None:
    """Ask the server behind `client` how many tokens its context holds (see the module doc).

    Returns:
        The smallest size a server reported for the client's model, or None when none said.
    """
    sdk = client.sdk_client
    base = str(sdk.base_url)
    root = _root(base)
    options: openai.RequestOptions = {
        "timeout": within,
        "max_retries": 0,
        "security": {"bearer_auth": True},
    }
    model = client.model

    async def get(url: str) -> object:
        return await sdk.get(url, cast_to=object, options=options)

    async def show() -> object:
        return await sdk.post(
            f"{root}/api/show", cast_to=object, body={"model": model}, options=options
        )

    questions: list[tuple[str, Callable[[], Awaitable[object]], Callable[[object], int | None]]] = [
        ("llama.cpp /props", lambda: get(f"{root}/props"), _llama_cpp),
        (
            "vLLM /v1/models",
            lambda: get(f"{base.rstrip('/')}/models"),
            lambda a: _listed(a, "data", "max_model_len", model),
        ),
        (
            "Ollama /api/ps",
            lambda: get(f"{root}/api/ps"),
            lambda a: _listed(a, "models", "context_length", model),
        ),
        ("Ollama /api/show", show, _ollama_show),
    ]

    async def ask(
        ask_server: Callable[[], Awaitable[object]], read: Callable[[object], int | None]
    ) -> int | None:
        try:
            async with asyncio.timeout(within):
                return read(await ask_server())
        except (openai.OpenAIError, ValueError, TypeError, TimeoutError):
            return None  # no such route, not this kind of server, not JSON, or no answer

    # Asked at once: the whole costs one round trip to a local server.
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(ask(question, read)) for _, question, read in questions]
    found = [
        ServerContext(size, source)
        for (source, _, _), task in zip(questions, tasks, strict=True)
        if (size := task.result()) is not None
    ]
    return min(found, key=lambda context: context.tokens, default=None)
