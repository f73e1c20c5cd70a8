"""`ServerSettings`: how `agent-flow serve` listens and what it lets clients do."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["ServerSettings", "is_loopback_host"]


def is_loopback_host(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerSettings(BaseModel):
    """The service's settings (the agent's own come from its `AgentConfig`).

    Attributes:
        host: The address to bind; anything but loopback requires `token`.
        port: The port to bind.
        token: A bearer token every request must carry (``Authorization: Bearer ...``);
            required off loopback.
        cors_origins: Origins allowed to call the API from a browser (none by default).
        max_body_bytes: Largest request body accepted; larger ones get 413.
        workspace_roots: Directories a session's workspace must lie under; without any, a
            session may not choose a workspace (the config's own is used).
        approval_timeout: Seconds a run waits for an approval before it is denied.
        watcher_queue: Events queued per SSE client before its back-pressure policy applies.
        keepalive_seconds: Idle seconds after which an SSE stream gets a ``: ping`` comment,
            so proxies do not cut it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    token: SecretStr | None = None
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = Field(default=1_000_000, ge=1)
    workspace_roots: tuple[Path, ...] = ()
    approval_timeout: float = Field(default=300.0, gt=0)
    watcher_queue: int = Field(default=1000, ge=1)
    keepalive_seconds: float = Field(default=15.0, gt=0)

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ServerSettings:
        if not is_loopback_host(self.host) and self.token is None:
            raise ValueError(
                f"binding to {self.host!r} exposes the agent beyond this machine; set a bearer "
                "token (--token or AGENT_FLOW_SERVER_TOKEN) or bind to 127.0.0.1"
            )
        if self.token is not None and not self.token.get_secret_value():
            raise ValueError("the bearer token is empty; give a non-empty token or none")
        return self
