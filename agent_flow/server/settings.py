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
        host: The address to bind; anything but loopback requires `token` or `tokens_file`.
        port: The port to bind.
        token: A bearer token every request must carry (``Authorization: Bearer ...``); its
            holder is the user ``admin``, who sees every session. ``agent-flow serve`` makes
            a random one when none is given (``--no-token`` serves without).
        tokens_file: A TOML file mapping tokens to users (`agent_flow.server._auth`); each
            user sees only the sessions it created, an admin sees all.
        server_names: Host names the server answers to besides IP addresses and
            ``localhost`` (a request naming another host gets 421, which defeats DNS
            rebinding); ``"*"`` answers to any (only behind a proxy that checks ``Host``).
        cors_origins: Origins allowed to call the API from a browser, and to change
            anything from a web page other than the inspector (none by default).
        allow_client_endpoints: Let a session name its own model endpoint (``base_url``);
            such a session sends no key. Off: sessions choose among the configured ones.
        max_body_bytes: Largest request body accepted; larger ones get 413.
        workspace_roots: Directories a session's workspace must lie under; without any, a
            session may not choose a workspace (the config's own is used).
        approval_timeout: Seconds a run waits for an approval before it is denied.
        watcher_queue: Events queued per SSE client before its back-pressure policy applies.
        watcher_max_wait: Seconds a run waits for a ``wait`` watcher that fell behind before
            dropping its oldest events (it then gets an ``events_dropped`` event).
        keepalive_seconds: Idle seconds after which an SSE stream gets a ``: ping`` comment,
            so proxies do not cut it.
        idle_seconds: A live session (its agent, model client and MCP subprocesses) unused
            this long is closed; the next request rebuilds it from the store.
        max_live_sessions: Live sessions kept at most; beyond, the least recently used idle
            ones are closed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    token: SecretStr | None = None
    tokens_file: Path | None = None
    server_names: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    allow_client_endpoints: bool = False
    max_body_bytes: int = Field(default=1_000_000, ge=1)
    workspace_roots: tuple[Path, ...] = ()
    approval_timeout: float = Field(default=300.0, gt=0)
    watcher_queue: int = Field(default=1000, ge=1)
    watcher_max_wait: float = Field(default=5.0, gt=0)
    keepalive_seconds: float = Field(default=15.0, gt=0)
    idle_seconds: float = Field(default=600.0, gt=0)
    max_live_sessions: int = Field(default=256, ge=1)

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ServerSettings:
        if not is_loopback_host(self.host) and self.token is None and self.tokens_file is None:
            raise ValueError(
                f"binding to {self.host!r} exposes the agent beyond this machine; set a bearer "
                "token (--token or AGENT_FLOW_SERVER_TOKEN) or bind to 127.0.0.1"
            )
        if self.token is not None and not self.token.get_secret_value():
            raise ValueError("the bearer token is empty; give a non-empty token or none")
        return self
