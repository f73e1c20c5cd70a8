"""``agent-flow serve``: the HTTP service (`agent_flow.server`) on uvicorn."""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agent_flow.cli._build import _load_config
from agent_flow.cli._exit import EXIT_OK, EXIT_USAGE, _Failure, _flag_failure, _Streams
from agent_flow.cli._run import _OTLP_ENDPOINTS
from agent_flow.cli._sessions import _check_db, _store
from agent_flow.errors import ConfigError
from agent_flow.sessions import SessionStore, open_store

if TYPE_CHECKING:
    from fastapi import FastAPI

    from agent_flow._demo.serve import DemoServer
    from agent_flow.durable import DurableClient
    from agent_flow.server import ServerSettings

#: Where ``serve`` reads the bearer token when ``--token`` is not given.
TOKEN_VARIABLE = "AGENT_FLOW_SERVER_TOKEN"
#: Where ``serve`` reads the tokens file when ``--tokens-file`` is not given.
TOKENS_FILE_VARIABLE = "AGENT_FLOW_SERVER_TOKENS_FILE"


async def _serve_command(args: argparse.Namespace, streams: _Streams) -> int:
    try:
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        from agent_flow.server import ServerSettings, create_app, with_json_400
        from agent_flow.server._auth import Users
    except ImportError as err:
        raise _Failure(
            EXIT_USAGE,
            f"agent-flow serve needs the server extra ({err.name} is missing); install it with "
            "pip install 'agent-flow[server]'",
        ) from None
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    tokens_file = args.tokens_file or os.environ.get(TOKENS_FILE_VARIABLE) or None
    if args.no_token and (token or tokens_file):
        raise _Failure(
            EXIT_USAGE,
            "--no-token serves without tokens, but a token or tokens file is given (flags or "
            f"{TOKEN_VARIABLE} / {TOKENS_FILE_VARIABLE}); drop one",
        )
    made_token = token is None and tokens_file is None and not args.no_token
    if made_token:
        token = secrets.token_urlsafe(24)
    try:
        settings = ServerSettings(
            host=args.host,
            port=args.port,
            token=token,
            tokens_file=tokens_file,
            server_names=tuple(args.server_name),
            cors_origins=tuple(args.cors_origin),
            allow_client_endpoints=args.allow_client_endpoints,
            workspace_roots=tuple(args.workspace_root),
        )
        if tokens_file is not None:
            Users.from_file(Path(tokens_file))  # a broken file is a usage error, now
        for root in settings.workspace_roots:
            if not root.is_dir():  # no session could ever choose a workspace under it
                raise _Failure(EXIT_USAGE, f"--workspace-root {root} is not a directory")
    except ValidationError as err:
        raise _flag_failure(err) from None
    except ConfigError as err:
        raise _Failure(EXIT_USAGE, str(err)) from None

    def warn(text: str) -> None:
        streams.stderr.write(f"agent-flow: warning: {text}\n")

    demo = _demo(args) if args.demo else None
    config = demo.config if demo is not None else _load_config(args.config, warn)
    if demo is None and not settings.allow_client_endpoints:
        from agent_flow.server._endpoints import operator_endpoints

        if not operator_endpoints(config):
            warn(
                "no model is configured, so every new session will be refused: give "
                "--config agent.toml naming one ([agent.llm] or [llms.NAME])"
            )
    durable = _durable_client(args.config) if demo is None else None
    on_agent = None
    export = None
    if args.otel or any(os.environ.get(name) for name in _OTLP_ENDPOINTS):
        # Imported here: the telemetry ring and OpenTelemetry only for a server that exports.
        from agent_flow.telemetry import configure_otlp, instrument

        export, on_agent = configure_otlp(), instrument
    try:
        async with _store(args) if demo is None else _demo_store(args, demo) as store:
            app = create_app(
                config,
                store=store,
                settings=settings,
                on_agent=on_agent,
                durable=durable,
                llm_factory=demo.llm if demo is not None else None,
            )
            # Event streams stay open until their client leaves: give them 5 s on shutdown.
            server = uvicorn.Server(
                uvicorn.Config(
                    app,
                    host=settings.host,
                    port=settings.port,
                    timeout_graceful_shutdown=5,
                    # Bytes that are no HTTP request get an ErrorBody, as every refusal does.
                    http=with_json_400(AutoHTTPProtocol),
                    # No WebSocket route: an upgrade request is answered as HTTP (JSON), not
                    # by a WebSocket library (plain text, or a 403 past the token check).
                    ws="none",
                )
            )
            # Bound before anything is said: an address in use is a usage error, and no token
            # is shown for a server that never ran.
            listening = _listen(settings.host, settings.port)
            try:
                await _announce(streams, app, settings, token if made_token else None, demo)
                await server.serve(sockets=listening)
            finally:
                for bound in listening:
                    bound.close()
    finally:
        if export is not None:
            export.shutdown()  # flushes what is buffered
        if durable is not None:
            durable.close()
    return EXIT_OK


async def _announce(
    streams: _Streams,
    app: FastAPI,
    settings: ServerSettings,
    made_token: str | None,
    demo: DemoServer | None,
) -> None:
    """Say where to go, with the token made here (once, on stderr: it grants everything)."""
    shown = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    shown = f"[{shown}]" if ":" in shown else shown
    address = f"http://{shown}:{settings.port}/"
    fragment = f"#token={made_token}" if made_token else ""
    if demo is not None:
        from agent_flow._demo.serve import start_demo_session

        session = await start_demo_session(app)
        fragment += f"{'&' if fragment else '#'}session={session}"
        streams.stderr.write(
            "agent-flow: demo: a scripted model (no model server, no key) is fixing a "
            f"bug in {demo.project}, in session {session!r}; watch it in the inspector, "
            "and approve its commands and writes there\n"
        )
    if made_token:
        streams.stderr.write(
            f"agent-flow: serving; open the inspector at {address}{fragment}\n"
            f"agent-flow: API clients send 'Authorization: Bearer {made_token}' (set "
            f"{TOKEN_VARIABLE} to choose it; --no-token serves without)\n"
        )
    else:
        streams.stderr.write(f"agent-flow: serving; the inspector is at {address}{fragment}\n")
    streams.stderr.flush()


def _listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address of `host` at `port`, or a usage error saying why not.

    Every address, as uvicorn's own binding takes them: ``localhost`` is 127.0.0.1 and ::1.
    """
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise _Failure(EXIT_USAGE, f"--host {host}: no such address ({err.strerror})") from None
    addresses = list(dict.fromkeys((family, address) for family, _, _, _, address in found))
    bound: list[socket.socket] = []
    try:
        for family, address in addresses:
            listening = socket.socket(family, socket.SOCK_STREAM)
            bound.append(listening)
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and len(addresses) > 1:
                # Beside an IPv4 socket of its own, the IPv6 one takes IPv6 alone.
                listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listening.bind(address)
    except OSError as err:
        for listening in bound:
            listening.close()
        raise _Failure(
            EXIT_USAGE,
            f"cannot listen on {host}:{port} ({err.strerror or err}); choose another --port, "
            "or stop what listens there",
        ) from None
    return bound


def _demo(args: argparse.Namespace) -> DemoServer:
    """The scripted agent of ``serve --demo``, its project in a new temporary directory."""
    from agent_flow._demo.serve import demo_server

    if args.config is not None:
        raise _Failure(
            EXIT_USAGE,
            "--demo serves its own scripted agent and takes no --config; drop one of them",
        )
    base = Path(tempfile.mkdtemp(prefix="agent-flow-serve-demo-"))
    return demo_server(base, pace=args.demo_pace)


def _demo_store(args: argparse.Namespace, demo: DemoServer) -> SessionStore:
    """``--db``, else a SQLite file beside the demo's project."""
    _check_db(args.db)
    return open_store(args.db if args.db is not None else str(demo.base / "sessions.db"))


def _durable_client(config: str | None) -> DurableClient | None:
    """The client that enqueues runs for workers, when ``[durable] enabled = true``."""
    from agent_flow.durable.config import load_durable_config

    settings = load_durable_config(config)
    if not settings.enabled:
        return None
    try:
        from agent_flow.durable import DurableClient
    except ImportError as err:
        raise _Failure(
            EXIT_USAGE,
            f"[durable] enabled = true needs the durable extra ({err.name} is missing); "
            "install it with pip install 'agent-flow[durable]'",
        ) from None
    return DurableClient(settings)
