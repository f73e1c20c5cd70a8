"""`ModelClients`: one HTTP client per model endpoint and key, shared by a server's sessions.

Building an `AsyncOpenAI` costs tens of milliseconds of CPU on the event loop (most of it the
TLS context), and each one keeps its own connection pool. A server builds one per endpoint
identity (base URL, key, organization, project, headers, timeouts) and hands every session an
`OpenAIClient` of its own around it (`OpenAIClient.from_config(..., sdk_client=...)`: cheap,
and closing it leaves the shared connections open). The manager owns this object and closes
every shared client at shutdown.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING

from agent_flow.llm.config import LLMConfig

if TYPE_CHECKING:
    from agent_flow.llm.openai_client import OpenAIClient

__all__ = ["ModelClients"]

_Identity = tuple[object, ...]


class ModelClients:
    """The shared SDK clients of one server, by endpoint identity."""

    def __init__(self) -> None:
        self._shared: dict[_Identity, OpenAIClient] = {}
        # Sessions' agents are built in worker threads (`SessionManager._build`).
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._shared)

    def client(self, config: LLMConfig) -> OpenAIClient:
        """A session's own client for `config`, on the shared connections of its endpoint.

        Raises:
            ConfigError: `config` cannot be built (no base URL, no key for OpenAI, ...).
        """
        from agent_flow.llm.openai_client import OpenAIClient

        identity = _identity(config)
        with self._lock:
            shared = self._shared.get(identity)
            if shared is None:
                shared = self._shared[identity] = OpenAIClient.from_config(config)
        return OpenAIClient.from_config(config, sdk_client=shared.sdk_client)

    async def aclose(self) -> None:
        """Close every shared client's connections."""
        shared, self._shared = list(self._shared.values()), {}
        for client in shared:
            await client.aclose()


def _identity(config: LLMConfig) -> _Identity:
    """What makes two configs need different SDK clients (the key only as a digest)."""
    key = config.read_api_key() if config.send_key else None
    digest = hashlib.sha256(key.get_secret_value().encode()).hexdigest() if key else ""
    return (
        config.resolved_base_url(),
        config.send_key,
        config.resolved_api_key_env(),
        digest,
        config.organization,
        config.project,
        tuple(sorted(config.headers.items())),
        config.timeout,
        config.connect_timeout,
    )
