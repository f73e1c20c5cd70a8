"""Who a request comes from, and whether the server answers it at all.

`Users` maps bearer tokens to users (`User`: a name, and whether it is an admin). It comes from
the server's one ``--token`` (its holder is the user ``admin``, an admin), from a tokens file
(``--tokens-file``), or from both. Tokens are kept only as SHA-256 digests; a file may give
either the token or its digest::

    [users.alice]
    token_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

    [users.ops]
    token = "a long random string"
    admin = true

`GuardMiddleware` runs before every route, in this order (each refusal is an `ErrorBody`):

1. ``Host`` must be a name this server answers to: an IP address, ``localhost`` (or a name
   under ``.localhost``), or one of `ServerSettings.server_names`; else 421 ``unknown_host``.
   A web page whose DNS name was rebound to this machine sends its own name, so it is refused.
2. A state-changing request (``POST``, ``PUT``, ``PATCH``, ``DELETE``) that carries an
   ``Origin`` must come from this server's own origin or one of
   `ServerSettings.cors_origins`; else 403 ``forbidden_origin``.
3. With users configured, every request but the inspector's static files needs
   ``Authorization: Bearer <token>`` (the scheme in any case, RFC 7235) naming a user; else
   401 ``unauthorized``. The user goes into ``scope["state"]["user"]``.
4. Without users (``--no-token``), a ``POST`` to a route that takes one must be
   ``Content-Type: application/json``, which a cross-origin HTML form cannot send; else 415
   ``unsupported_media_type``. (A ``POST`` no route takes changes nothing: the router answers
   it with 405 and ``Allow``, or 404.)

Every refusal is also logged on ``agent_flow.server.audit`` as one JSON line.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.resources
import ipaddress
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_flow._toml_file import read_toml
from agent_flow.errors import ConfigError
from agent_flow.server._errors import send_error

__all__ = ["ADMIN", "GuardMiddleware", "User", "Users", "audit_log", "request_user"]

audit = logging.getLogger("agent_flow.server.audit")


@dataclass(frozen=True)
class User:
    """Someone the server knows by a token."""

    name: str
    admin: bool = False

    def may_see(self, owner: str | None) -> bool:
        """Whether this user may see a session owned by `owner` (None: the admin's)."""
        return self.admin or (owner is not None and owner == self.name)


#: The user of a server without tokens, and of the one ``--token``: it sees everything.
ADMIN = User("admin", admin=True)

#: The inspector's files hold no data: they load without a token (the page asks for it).
_PUBLIC = frozenset(
    {
        "/",
        *(
            f"/static/{item.name}"
            for item in importlib.resources.files("agent_flow.server").joinpath("static").iterdir()
            if item.name.endswith((".js", ".css"))
        ),
    }
)
_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Users:
    """Bearer tokens and the users they name (see the module doc)."""

    def __init__(self, users: Mapping[str, User] | None = None) -> None:
        #: Users by the SHA-256 hex digest of their token.
        self._by_digest: dict[str, User] = dict(users or {})

    @classmethod
    def build(cls, *, token: str | None = None, tokens_file: Path | None = None) -> Users | None:
        """The users of `token` (the admin) and `tokens_file`; None when neither is given.

        Raises:
            ConfigError: The file cannot be read, or is not of the documented form.
        """
        if token is None and tokens_file is None:
            return None
        users = cls.from_file(tokens_file) if tokens_file is not None else cls()
        if token is not None:
            users._add(_digest(token), ADMIN, where="--token")
        return users

    @classmethod
    def from_file(cls, path: Path) -> Users:
        """Read a tokens file (see the module doc).

        Raises:
            ConfigError: It cannot be read, or is not of the documented form.
        """
        document = read_toml(path, what="tokens file")
        table = document.get("users")
        if not isinstance(table, dict) or not table or set(document) - {"users"}:
            raise ConfigError(
                f"the tokens file {str(path)!r} must hold only [users.NAME] tables, at least one"
            )
        users = cls()
        for name, entry in table.items():
            users._add(*_entry(path, name, entry), where=f"[users.{name}]")
        return users

    def _add(self, digest: str, user: User, *, where: str) -> None:
        if digest in self._by_digest:
            raise ConfigError(
                f"{where} has the token of user {self._by_digest[digest].name!r}; give every "
                "user a token of its own"
            )
        self._by_digest[digest] = user

    def authenticate(self, authorization: bytes | None) -> User | None:
        """The user an ``Authorization`` header names (None: missing, malformed or unknown)."""
        if not authorization:
            return None
        scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        digest = _digest(token)
        for known, user in self._by_digest.items():
            # Every digest is compared, in constant time: no timing says which one was close.
            if hmac.compare_digest(known, digest):
                return user
        return None

    def names(self) -> list[str]:
        """The users' names (for messages and logs)."""
        return sorted({user.name for user in self._by_digest.values()})


def _entry(path: Path, name: str, entry: object) -> tuple[str, User]:
    where = f"[users.{name}] in {str(path)!r}"
    if not isinstance(entry, dict) or set(entry) - {"token", "token_sha256", "admin"}:
        raise ConfigError(f"{where} may hold only token, token_sha256 and admin")
    token, digest, admin = entry.get("token"), entry.get("token_sha256"), entry.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError(f"{where}: admin must be true or false")
    if (token is None) == (digest is None):
        raise ConfigError(f"{where} needs exactly one of token and token_sha256")
    if token is not None:
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigError(f"{where}: the token must be a string of 16 characters or more")
        return _digest(token), User(name, admin=admin)
    if not isinstance(digest, str) or len(digest) != 64 or set(digest) - set("0123456789abcdef"):
        raise ConfigError(f"{where}: token_sha256 must be 64 lower-case hex digits")
    return digest, User(name, admin=admin)


def request_user(scope: Scope) -> User:
    """The user `GuardMiddleware` found for a request (the admin when the server has no users)."""
    user = scope.get("state", {}).get("user")
    return user if isinstance(user, User) else ADMIN


def audit_log(action: str, **fields: object) -> None:
    """One structured audit line: what happened, to what, by whom (JSON, one line)."""
    audit.info(json.dumps({"audit": action, **fields}, default=str, sort_keys=True))


def is_local_name(host: str) -> bool:
    """Whether `host` (without port) cannot be a rebound DNS name: an IP, or localhost."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _split_host(value: str) -> tuple[str, int | None]:
    """``host[:port]`` → (host, port); None port when absent. Raises ValueError if malformed."""
    parts = urlsplit(f"//{value}")
    host = parts.hostname
    if not host:
        raise ValueError(value)
    return host.lower().rstrip("."), parts.port


class GuardMiddleware:
    """Host, Origin, token and content-type checks before any route (see the module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        users: Users | None,
        server_names: Iterable[str] = (),
        origins: Iterable[str] = (),
        routes: Sequence[BaseRoute] | None = None,
    ) -> None:
        self.app = app
        self.users = users
        #: The routes behind the guard (None: every POST is taken to reach one).
        self._routes = routes
        names = {name.lower().rstrip(".") for name in server_names}
        self._any_host = "*" in names
        self._names = names - {"*"}
        self._origins = {origin.rstrip("/").lower() for origin in origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        method, path = scope["method"], scope["path"]
        host = headers.get(b"host", b"").decode("latin-1")
        refusal = self._refusal(scope, headers, host)
        if refusal is not None:
            status, code, message = refusal
            audit_log(
                "refused",
                status=status,
                code=code,
                method=method,
                path=path,
                client=(scope.get("client") or ("?",))[0],
            )
            await send_error(send, status, code, message)
            return
        await self.app(scope, receive, send)

    def _refusal(
        self, scope: Scope, headers: dict[bytes, bytes], host: str
    ) -> tuple[int, str, str] | None:
        method, path = scope["method"], scope["path"]
        try:
            hostname, port = _split_host(host)
        except ValueError:
            return 400, "bad_request", "the request has no valid Host header; send one"
        if not (self._any_host or is_local_name(hostname) or hostname in self._names):
            return (
                421,
                "unknown_host",
                f"this server does not answer to the name {hostname!r}; use its address, or "
                "start it with --server-name NAME",
            )
        if method in _STATE_CHANGING:
            origin = headers.get(b"origin")
            if origin is not None and not self._same_or_allowed(
                origin.decode("latin-1"), scope, hostname, port
            ):
                return (
                    403,
                    "forbidden_origin",
                    f"requests from the web page at {origin.decode('latin-1')!r} may not change "
                    "anything here; start the server with --cors-origin to allow that origin",
                )
        if self.users is not None:
            if method == "GET" and path in _PUBLIC:
                return None
            user = self.users.authenticate(headers.get(b"authorization"))
            if user is None:
                return (
                    401,
                    "unauthorized",
                    "this server requires 'Authorization: Bearer <token>' with a token it knows",
                )
            scope.setdefault("state", {})["user"] = user
            return None
        if method == "POST" and self._taken(scope):
            media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if media != b"application/json":
                return (
                    415,
                    "unsupported_media_type",
                    "send 'Content-Type: application/json' with every POST (an empty body "
                    "needs it too: a web page's form cannot send it)",
                )
        return None

    def _taken(self, scope: Scope) -> bool:
        """Whether a route takes this request (its path and its method)."""
        if self._routes is None:
            return True
        return any(route.matches(scope)[0] is Match.FULL for route in self._routes)

    def _same_or_allowed(self, origin: str, scope: Scope, hostname: str, port: int | None) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self._origins:
            return True
        try:
            parts = urlsplit(origin)
            their_port = parts.port  # raises for a port out of range or not a number
        except ValueError:
            return False  # no browser sends it ("http://[::1", "http://x:99999"): not an origin
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            return False  # "null" (sandboxed frames, files), or not a web origin
        # Same origin: the page was loaded from the name and port this request is sent to.
        # The scheme may differ behind a TLS-terminating proxy; the name cannot.
        scheme = scope.get("scheme", "http")
        own_port = port if port is not None else _DEFAULT_PORTS.get(scheme, 80)
        if their_port is None:
            their_port = _DEFAULT_PORTS[parts.scheme]
            same_port = own_port == their_port or port is None
        else:
            same_port = own_port == their_port
        return parts.hostname.rstrip(".") == hostname and same_port
