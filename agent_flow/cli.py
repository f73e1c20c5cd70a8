"""The ``agent-flow`` command: run an agent, chat with it, the offline demo, sessions, tools.

::

    agent-flow run "task" [--model M] [--base-url URL] [--workspace DIR] [--mcp "cmd args"] ...
    agent-flow chat [same options]            a REPL over one session
    agent-flow demo [--slow]                  a complete run offline, with a scripted model
    agent-flow sessions list | show ID | export ID [--output FILE] | import FILE | delete ID
    agent-flow tools [--workspace DIR] [--mcp "cmd args"]   what an agent is offered, in tokens

Runs talk to any OpenAI-compatible endpoint; the key comes from ``OPENAI_API_KEY`` (or the
variable named by ``--api-key-env``) and is never printed. Every run is stored as it goes in
a SQLite session store (``--db``, default `agent_flow.store.default_store_path`), so a run
that is interrupted can be continued with ``--session ID``.

Exit codes:

- 0: the run finished: the task was completed, answered, or the agent waits for a reply;
- 1: the run ended without finishing (iteration, token or cost limit, stuck, invalid output),
  or the session store failed;
- 2: a usage or configuration error: a bad flag or config key (named with its file), no API
  key, an unknown session, a workspace or MCP server that cannot be used;
- 3: the model endpoint failed: unreachable, timed out, or it refused the key or the request;
- 130: cancelled with Ctrl-C; the session is kept.

Errors are one line on stderr, saying what is wrong and what to do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, NoReturn

from pydantic import ValidationError

from agent_flow import errors
from agent_flow._render import EventRenderer, JsonLinesWriter, make_console
from agent_flow.agent import AgentExecutor, ExecutionOutcome, StopReason, tool_executor_from_config
from agent_flow.config import AgentConfig, load_config
from agent_flow.environment import Environment, SystemState
from agent_flow.errors import (
    AgentFlowError,
    ConfigError,
    MCPServerError,
    ModelError,
    SessionNotFoundError,
    StoreError,
    UserError,
)
from agent_flow.llm import LLMConfig, LLMOverrides, OpenAIClient, resolve_llm_config
from agent_flow.llm.base import Completion, LLMRequest, StreamEvent
from agent_flow.sessions import SQLiteSessionStore, default_store_path
from agent_flow.tools import (
    ApprovalRequest,
    ApprovalResponse,
    MCPServerConfig,
    MCPServerHTTP,
    MCPServers,
    MCPServerStdio,
    ToolExecutor,
    Workspace,
    workspace_tools,
)

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_MODEL",
    "EXIT_OK",
    "EXIT_RUN_FAILED",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_MODEL = 3
EXIT_CANCELLED = 130

_EPILOG = """\
exit codes:
  0    the run finished: task completed, answered, or the agent waits for your reply
  1    the run ended without finishing (a limit, stuck, invalid output) or the store failed
  2    usage or configuration error: bad flag or config key, no API key, unknown session,
       a workspace or MCP server that cannot be used
  3    the model endpoint failed: unreachable, timed out, refused the key or the request
  130  cancelled with Ctrl-C (the session is kept: continue it with --session ID)

environment:
  OPENAI_API_KEY   the API key (or name another variable with --api-key-env)
  OPENAI_BASE_URL  the endpoint when --base-url is not given
  AGENT_FLOW_*     config overrides, e.g. AGENT_FLOW_CONTEXT__MAX_TOKENS=16000
  AGENT_FLOW_HOME  where the session store lives (default ~/.local/share/agent_flow)

Start with `agent-flow demo`: a complete agent run, offline, with no API key.
"""

_OK_REASONS = frozenset(
    {StopReason.COMPLETED, StopReason.ANSWERED, StopReason.CONVERSE, StopReason.WAITING_FOR_USER}
)


class _Failure(Exception):
    """Ends the command with `code` after printing `message` as one error line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Streams:
    stdin: IO[str]
    stdout: IO[str]
    stderr: IO[str]


# -- the parser ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _agent_options() -> _Parser:
    options = _Parser(add_help=False)
    model = options.add_argument_group("model")
    model.add_argument("--model", help="the model name the endpoint knows (e.g. gpt-4o-mini)")
    model.add_argument(
        "--base-url",
        help="an OpenAI-compatible endpoint, e.g. http://localhost:11434/v1 (default: "
        "OPENAI_BASE_URL, else OpenAI)",
    )
    model.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="the environment variable holding the API key (default OPENAI_API_KEY)",
    )
    agent = options.add_argument_group("agent")
    agent.add_argument("--config", metavar="FILE", help="an agent.toml file ([agent], [llms.*])")
    agent.add_argument(
        "--workspace", metavar="DIR", help="give the agent the built-in file tools on DIR"
    )
    agent.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar='"[NAME=]COMMAND ARGS"',
        help="an MCP server started over stdio (repeatable); its tools are named NAME_tool",
    )
    agent.add_argument(
        "--mcp-http",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="an MCP server reached over streamable HTTP (repeatable)",
    )
    agent.add_argument("--max-iterations", type=_positive, metavar="N", help="model calls per run")
    agent.add_argument(
        "--budget", type=_positive, metavar="TOKENS", help="the hard token budget of every prompt"
    )
    agent.add_argument("--session", metavar="ID", help="continue this stored session")
    agent.add_argument("--yes", action="store_true", help="approve every tool call that asks")
    agent.add_argument("--db", metavar="PATH", help=f"the session store (default {_db_hint()})")
    output = options.add_argument_group("output")
    output.add_argument(
        "--json", action="store_true", help="print events as JSON lines instead of rendering"
    )
    return options


def _db_hint() -> str:
    try:
        return str(default_store_path())
    except RuntimeError:  # no home directory
        return "$AGENT_FLOW_HOME/sessions.db"


def build_parser() -> argparse.ArgumentParser:
    """The ``agent-flow`` argument parser."""
    from agent_flow import __version__

    parser = _Parser(
        prog="agent-flow",
        description="Stateful, tool-using LLM agents whose every prompt fits a token budget.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"agent-flow {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    agent_options = _agent_options()
    db = _Parser(add_help=False)
    db.add_argument("--db", metavar="PATH", help=f"the session store (default {_db_hint()})")

    def sub(name: str, help: str, parents: Sequence[_Parser] = ()) -> _Parser:
        command: _Parser = commands.add_parser(
            name,
            help=help,
            description=help,
            parents=list(parents),
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return command

    run = sub("run", "run an agent on a task until it finishes", [agent_options])
    run.add_argument("task", help="what the agent should do (or your reply, with --session)")
    run.set_defaults(handler=_run_command)

    chat = sub("chat", "talk with an agent: one session, one message per line", [agent_options])
    chat.set_defaults(handler=_chat_command)

    demo = sub("demo", "a complete agent run, offline, with a scripted model and no API key")
    demo.add_argument("--slow", action="store_true", help="stream at a watchable pace")
    demo.add_argument(
        "--workdir", metavar="DIR", help="where the project goes (default: a new temp directory)"
    )
    demo.add_argument("--db", metavar="PATH", help="the session store (default: in --workdir)")
    demo.add_argument(
        "--setup-only",
        action="store_true",
        help="only create the project, and print how to run the task with a real model",
    )
    demo.set_defaults(handler=_demo_command)

    sessions = sub("sessions", "list, show, export, import or delete stored sessions")
    actions = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the most recent sessions", parents=[db])
    listing.add_argument("--limit", type=_positive, default=20, help="how many (default 20)")
    listing.add_argument("--json", action="store_true", help="one JSON object per session")
    listing.set_defaults(handler=_sessions_list)
    show = actions.add_parser(
        "show", help="a session's history, environment and runs", parents=[db]
    )
    show.add_argument("id")
    show.add_argument("--environment", action="store_true", help="print the environment as JSON")
    show.set_defaults(handler=_sessions_show)
    export = actions.add_parser("export", help="a session as JSON lines", parents=[db])
    export.add_argument("id")
    export.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    export.set_defaults(handler=_sessions_export)
    imported = actions.add_parser("import", help="store a session from an export", parents=[db])
    imported.add_argument("file")
    imported.add_argument("--id", help="store it under this id (default: the exported one)")
    imported.set_defaults(handler=_sessions_import)
    delete = actions.add_parser("delete", help="delete a session", parents=[db])
    delete.add_argument("id")
    delete.set_defaults(handler=_sessions_delete)

    tools = sub(
        "tools",
        "list the tools an agent would be offered, with the tokens their schemas cost",
        [_tools_options()],
    )
    tools.set_defaults(handler=_tools_command)
    return parser


def _tools_options() -> _Parser:
    options = _Parser(add_help=False)
    options.add_argument("--config", metavar="FILE", help="an agent.toml file")
    options.add_argument("--workspace", metavar="DIR", help="include the built-in file tools")
    options.add_argument("--mcp", action="append", default=[], metavar='"[NAME=]COMMAND ARGS"')
    options.add_argument("--mcp-http", action="append", default=[], metavar="[NAME=]URL")
    options.add_argument("--model", help="count tokens with this model's tokenizer")
    return options


# -- the entry point -----------------------------------------------------------------------


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Run the ``agent-flow`` command and return its exit code (see the module docstring).

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        stdin: Where chat messages and approval answers are read (default ``sys.stdin``).
        stdout: Where output goes (default ``sys.stdout``).
        stderr: Where errors go (default ``sys.stderr``).
    """
    streams = _Streams(stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace, _Streams], Coroutine[None, None, int]] = args.handler
    try:
        return asyncio.run(handler(args, streams))
    except KeyboardInterrupt:
        _error_line(streams, "cancelled")
        return EXIT_CANCELLED
    except BrokenPipeError:
        # The reader went away (`agent-flow sessions export ID | head`): stop quietly.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), streams.stdout.fileno())
        return EXIT_RUN_FAILED
    except _Failure as failure:
        _error_line(streams, failure.message)
        return failure.code
    except AgentFlowError as err:
        code, message = _describe_error(err)
        _error_line(streams, message)
        return code


def _error_line(streams: _Streams, message: str) -> None:
    streams.stderr.write(f"agent-flow: error: {' '.join(message.split())}\n")
    streams.stderr.flush()


def _describe_error(err: AgentFlowError) -> tuple[int, str]:
    """The exit code and the one-line message for an error that ended the command."""
    if isinstance(err, SessionNotFoundError):
        return EXIT_USAGE, f"{err} (see `agent-flow sessions list`)"
    if isinstance(err, MCPServerError):
        return EXIT_USAGE, f"an MCP server could not be started: {err}; check its command or URL"
    if isinstance(err, UserError):
        return EXIT_USAGE, str(err)
    if isinstance(err, ModelError):
        return EXIT_MODEL, str(err)
    if isinstance(err, StoreError):
        return EXIT_RUN_FAILED, str(err)
    return EXIT_RUN_FAILED, f"{type(err).__name__}: {err}"


# -- building an agent ---------------------------------------------------------------------


def _agent_config(args: argparse.Namespace) -> AgentConfig:
    """The config file (or defaults) with AGENT_FLOW_* variables, then the flags on top."""
    config = load_config(args.config)
    updates: dict[str, object] = {}
    flags: list[str] = []
    if getattr(args, "max_iterations", None) is not None:
        updates["max_iterations"] = args.max_iterations
        flags.append(f"--max-iterations {args.max_iterations}")
    if getattr(args, "budget", None) is not None:
        context = config.context.model_dump()
        context["max_tokens"] = args.budget
        context["reserve_output_tokens"] = min(context["reserve_output_tokens"], args.budget // 4)
        updates["context"] = context
        flags.append(f"--budget {args.budget}")
    if not updates:
        return config
    try:
        return AgentConfig.model_validate({**config.model_dump(), **updates})
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise ConfigError(f"{' '.join(flags)} gives an invalid {where}: {problem['msg']}") from err


def _llm_config(config: AgentConfig, args: argparse.Namespace) -> LLMConfig:
    """The model to call: the config's, with --model / --base-url / --api-key-env on top."""
    flags = LLMOverrides(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env)
    own = config.llm_overrides
    has_model = config.llm is not None or (own is not None and own.model is not None)
    if has_model:
        return config.resolved_llm().with_overrides(flags)
    if args.model is None:
        where = f" or set [agent] llm in {args.config}" if args.config else ""
        raise _Failure(
            EXIT_USAGE,
            f"no model is configured: pass --model NAME{where} (try `agent-flow demo` to see "
            "an agent run without one)",
        )
    merged = {
        **(own.model_dump(exclude_none=True) if own is not None else {}),
        **flags.model_dump(exclude_none=True),
    }
    return resolve_llm_config(overrides=LLMOverrides.model_validate(merged))


def _check_credentials(llm: LLMConfig) -> None:
    base_url = llm.resolved_base_url() or os.environ.get("OPENAI_BASE_URL")
    key_env = llm.resolved_api_key_env()
    if base_url is None and not os.environ.get(key_env):
        hint = "" if llm.api_key_env else " (or name another variable with --api-key-env)"
        raise _Failure(
            EXIT_USAGE,
            f"no API key: the environment variable {key_env} is not set; export it{hint}, or "
            "point --base-url at a local server such as http://localhost:11434/v1",
        )


_NAME = re.compile(r"^([A-Za-z0-9_-]{1,40})=(.+)$", re.DOTALL)
_LAUNCHERS = frozenset({"python", "python3", "node", "npx", "uvx", "uv", "bun", "bunx", "deno"})


def _server_name(tokens: Sequence[str], taken: set[str]) -> str:
    """A name for an MCP server from its command: the script or module it runs."""
    command = Path(tokens[0]).name
    candidate = command
    if command in _LAUNCHERS or command.startswith("python"):
        rest = [t for t in tokens[1:] if not t.startswith("-") or t == "-m"]
        if "-m" in rest and rest.index("-m") + 1 < len(rest):
            candidate = rest[rest.index("-m") + 1].rsplit(".", 1)[-1]
        elif rest:
            candidate = Path(rest[0]).name
    candidate = re.sub(r"\.(py|js|mjs|ts)$", "", candidate)
    candidate = re.sub(r"^(mcp[-_]server[-_]|server[-_]|mcp[-_])", "", candidate)
    candidate = re.sub(r"([-_]mcp[-_]server|[-_]server|[-_]mcp)$", "", candidate)
    candidate = re.sub(r"[^A-Za-z0-9_-]+", "_", candidate).strip("_-")[:32] or "mcp"
    name, number = candidate, 2
    while name in taken:
        name, number = f"{candidate}{number}", number + 1
    return name


def _mcp_servers(
    config: AgentConfig, stdio: Sequence[str], http: Sequence[str]
) -> list[MCPServerConfig]:
    servers: list[MCPServerConfig] = list(config.mcp_servers)
    taken = {server.name for server in servers}
    for spec in stdio:
        named = _NAME.match(spec.strip())
        text = named.group(2) if named else spec
        try:
            tokens = shlex.split(text)
        except ValueError as err:
            raise _Failure(
                EXIT_USAGE, f"--mcp {spec!r} is not a valid command line: {err}"
            ) from err
        if not tokens:
            raise _Failure(EXIT_USAGE, "--mcp needs a command, e.g. --mcp 'npx -y server-x /tmp'")
        name = named.group(1) if named else _server_name(tokens, taken)
        if name in taken:
            raise _Failure(EXIT_USAGE, f"two MCP servers are named {name!r}; use --mcp 'NAME=...'")
        taken.add(name)
        servers.append(MCPServerStdio(name=name, command=tokens[0], args=tuple(tokens[1:])))
    for spec in http:
        named = _NAME.match(spec.strip())
        url = named.group(2) if named else spec.strip()
        if not url.startswith(("http://", "https://")):
            raise _Failure(EXIT_USAGE, f"--mcp-http {spec!r} is not an http(s) URL")
        name = named.group(1) if named else _server_name(["http"], taken)
        if name in taken:
            raise _Failure(
                EXIT_USAGE, f"two MCP servers are named {name!r}; use --mcp-http NAME=URL"
            )
        taken.add(name)
        servers.append(MCPServerHTTP(name=name, url=url))
    return servers


@dataclass
class _Tools:
    executor: ToolExecutor
    workspace: Workspace | None
    sources: dict[str, str]


async def _tools(
    args: argparse.Namespace, config: AgentConfig, stack: contextlib.AsyncExitStack
) -> _Tools:
    """The tool executor with the workspace tools and the MCP servers' tools, started."""
    executor = tool_executor_from_config(config.model_copy(update={"workspace": None}))
    sources: dict[str, str] = {}
    directory = args.workspace or config.workspace
    workspace = Workspace(directory) if directory else None
    if workspace is not None:
        for name in executor.register_all(workspace_tools(workspace)):
            sources[name] = "workspace"
    servers = _mcp_servers(config, args.mcp, args.mcp_http)
    if servers:
        started = await stack.enter_async_context(MCPServers(servers))
        for server, tool in started.tools():
            sources[executor.register(tool, namespace=server)] = f"mcp:{server}"
    return _Tools(executor, workspace, sources)


class _LineReader:
    """Reads lines from a stream on a daemon thread.

    Waiting never blocks the event loop, and an abandoned wait (Ctrl-C at a prompt) leaves
    nothing behind that the interpreter must join on exit.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._queue: asyncio.Queue[str | None] | None = None
        self._eof = False

    async def readline(self) -> str | None:
        """The next line without its newline, or None at the end of the input."""
        if self._eof:
            return None
        if self._queue is None:
            self._queue = asyncio.Queue()
            thread = threading.Thread(
                target=self._pump,
                args=(asyncio.get_running_loop(), self._queue),
                name="agent-flow-stdin",
                daemon=True,
            )
            thread.start()
        line = await self._queue.get()
        if line is None:
            self._eof = True
            return None
        return line.rstrip("\n")

    def _pump(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
        while True:
            try:
                line = self._stream.readline()
            except (OSError, ValueError):
                line = ""
            try:
                loop.call_soon_threadsafe(queue.put_nowait, line or None)
            except RuntimeError:  # the loop is closed: nobody is reading any more
                return
            if not line:
                return


class _Approver:
    """Answers approval requests: --yes approves, a terminal asks, anything else refuses."""

    def __init__(
        self, *, auto: bool, reader: _LineReader, stdin: IO[str], renderer: EventRenderer
    ) -> None:
        self.auto = auto
        self.reader = reader
        self.stdin = stdin
        self.renderer = renderer

    async def __call__(self, request: ApprovalRequest) -> ApprovalResponse:
        if self.auto:
            return ApprovalResponse(approved=True, reason="approved by --yes")
        try:
            interactive = self.stdin.isatty()
        except (AttributeError, ValueError):
            interactive = False
        if not interactive:
            return ApprovalResponse(
                approved=False,
                reason="nobody could be asked (stdin is not a terminal); rerun with --yes to "
                "approve such calls",
            )
        self.renderer.stop_spinner()
        self.renderer.console.print(
            f"  allow {request.tool_name} ({request.risk.value} risk)? [y/N] ", end=""
        )
        answer = await self.reader.readline()
        approved = (answer or "").strip().lower() in ("y", "yes")
        return ApprovalResponse(
            approved=approved,
            reason="approved at the terminal" if approved else "refused at the terminal",
        )


class _Interrupts:
    """While active, Ctrl-C calls `on_interrupt` once; pressing it again quits at once.

    Only the main thread can take signals; elsewhere (an embedding, a test) this does nothing.
    """

    def __init__(self, on_interrupt: Callable[[], None]) -> None:
        self.on_interrupt = on_interrupt
        self.count = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> _Interrupts:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, self._handle)
        except (NotImplementedError, RuntimeError, ValueError):
            return self
        self._loop = loop
        return self

    def _handle(self) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.on_interrupt()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)


@dataclass
class _Session:
    agent: AgentExecutor
    llm: OpenAIClient
    store: SQLiteSessionStore
    renderer: EventRenderer
    resumed: bool
    reader: _LineReader


async def _open_session(
    args: argparse.Namespace, streams: _Streams, stack: contextlib.AsyncExitStack
) -> _Session:
    """Everything `run` and `chat` share: config, model, store, tools, approvals, rendering."""
    config = _agent_config(args)
    llm_config = _llm_config(config, args)
    _check_credentials(llm_config)
    config = config.model_copy(update={"llm": llm_config, "llm_overrides": None})
    llm = OpenAIClient.from_config(llm_config)
    stack.push_async_callback(llm.aclose)
    store = await stack.enter_async_context(SQLiteSessionStore(args.db))
    tools = await _tools(args, config, stack)
    console = make_console(streams.stderr if args.json else streams.stdout)
    renderer = EventRenderer(console)
    reader = _LineReader(streams.stdin)
    approver = _Approver(auto=args.yes, reader=reader, stdin=streams.stdin, renderer=renderer)
    if args.session:
        agent = await AgentExecutor.resume(
            store, args.session, llm, config=config, tools=tools.executor, approval=approver
        )
    else:
        environment = Environment()
        if tools.workspace is not None:
            environment = (
                Environment.builder()
                .system(
                    SystemState(
                        working_directory=str(tools.workspace.root),
                        permissions=["read", "write", "execute"],
                    )
                )
                .build()
            )
        agent = AgentExecutor(
            llm,
            config=config,
            tools=tools.executor,
            environment=environment,
            approval=approver,
            store=store,
        )
    agent.events.on(None, JsonLinesWriter(streams.stdout) if args.json else renderer)
    return _Session(agent, llm, store, renderer, bool(args.session), reader)


def _exit_code(outcome: ExecutionOutcome) -> int:
    if outcome.stop_reason in _OK_REASONS:
        return EXIT_OK
    if outcome.stop_reason is StopReason.CANCELLED:
        return EXIT_CANCELLED
    fatal = [e for e in outcome.errors if e.fatal]
    if outcome.stop_reason is StopReason.ERROR and fatal:
        kind = getattr(errors, fatal[-1].type, None)
        if isinstance(kind, type) and issubclass(kind, ModelError):
            return EXIT_MODEL
    return EXIT_RUN_FAILED


def _failure_message(outcome: ExecutionOutcome) -> str | None:
    """The error line of a run that ended in a fatal error (model errors say what to do)."""
    fatal = [e for e in outcome.errors if e.fatal]
    if outcome.stop_reason is not StopReason.ERROR or not fatal:
        return None
    error = fatal[-1]
    kind = getattr(errors, error.type, None)
    if isinstance(kind, type) and issubclass(kind, ModelError):
        return error.message
    return f"the run failed: {error.type}: {error.message}"


def _report(
    outcome: ExecutionOutcome, session: _Session, streams: _Streams, json_mode: bool
) -> int:
    """Print how the run ended and how to continue; return the exit code."""
    say = session.renderer.line
    session_id = session.agent.session_id or "?"
    where = shlex.quote(str(session.store.path))
    again = f"agent-flow run --session {session_id} --db {where}"
    reason = outcome.stop_reason
    if reason is StopReason.WAITING_FOR_USER:
        say(f"the agent asks: {outcome.final_text}", "bold")
        say(f'answer with:  {again} "your answer"')
    elif reason is StopReason.CANCELLED:
        say(f'cancelled; the session is kept: continue with  {again} "..."', "yellow")
    elif reason is StopReason.ERROR:
        say(f'the session is kept; once fixed, continue with  {again} "..."', "dim")
    elif reason not in _OK_REASONS:
        say(f'the run stopped: {reason.value}; continue with  {again} "..."', "yellow")
    if json_mode or reason in _OK_REASONS:
        say(f"session {session_id} saved in {session.store.path}", "dim")
    message = _failure_message(outcome)
    if message is not None:
        _error_line(streams, message)
    return _exit_code(outcome)


# -- commands ------------------------------------------------------------------------------


async def _run_command(args: argparse.Namespace, streams: _Streams) -> int:
    async with contextlib.AsyncExitStack() as stack:
        session = await _open_session(args, streams, stack)
        agent = session.agent

        def cancel() -> None:
            session.renderer.line("cancelling… (Ctrl-C again quits at once)", "yellow")
            agent.cancel()

        with _Interrupts(cancel):
            if session.resumed:
                outcome = await agent.send(args.task)
            else:
                outcome = await agent.run(args.task)
        return _report(outcome, session, streams, args.json)


_CHAT_HELP = "type a message; /env shows the environment, /exit (or end of input) leaves"


async def _chat_command(args: argparse.Namespace, streams: _Streams) -> int:
    async with contextlib.AsyncExitStack() as stack:
        session = await _open_session(args, streams, stack)
        agent, say = session.agent, session.renderer.line
        stop = asyncio.Event()
        turn: asyncio.Task[ExecutionOutcome] | None = None

        def interrupt() -> None:
            if turn is not None and not turn.done():
                say("cancelling this turn… (Ctrl-C again quits)", "yellow")
                agent.cancel()
            else:
                stop.set()

        started = session.resumed
        code = EXIT_OK
        what = f"session {args.session}" if session.resumed else "a new session"
        say(f"chat with {session.llm.model} in {what}; {_CHAT_HELP}", "dim")
        with _Interrupts(interrupt) as interrupts:
            while True:
                session.renderer.console.print("you> ", end="")
                line = await _read_or_stop(session.reader, stop)
                if stop.is_set():
                    session.renderer.console.print()
                    code = EXIT_CANCELLED
                    break
                if line is None:
                    session.renderer.console.print()
                    break
                message = line.strip()
                if not message:
                    continue
                if message in ("/exit", "/quit"):
                    break
                if message == "/env":
                    counter = agent.context.counter
                    say(agent.environment.render(agent.context.max_tokens, counter) or "(empty)")
                    continue
                if message == "/help":
                    say(_CHAT_HELP)
                    continue
                turn = asyncio.ensure_future(agent.send(message) if started else agent.run(message))
                started = True
                outcome = await turn
                turn = None
                interrupts.count = 0
                code = _chat_turn_report(outcome, session, streams)
        if agent.session_id is not None:
            say(f"session {agent.session_id} saved in {session.store.path}", "dim")
        return code


def _chat_turn_report(outcome: ExecutionOutcome, session: _Session, streams: _Streams) -> int:
    if outcome.stop_reason is StopReason.WAITING_FOR_USER:
        session.renderer.line(f"the agent asks: {outcome.final_text}", "bold")
    message = _failure_message(outcome)
    if message is not None:
        _error_line(streams, message)
    code = _exit_code(outcome)
    return EXIT_OK if code == EXIT_CANCELLED else code


async def _read_or_stop(reader: _LineReader, stop: asyncio.Event) -> str | None:
    read = asyncio.ensure_future(reader.readline())
    stopped = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in (read, stopped):
        if task not in done:
            task.cancel()
    return read.result() if read in done else None


async def _demo_command(args: argparse.Namespace, streams: _Streams) -> int:
    from agent_flow.demo import create_project, real_endpoint_commands, run_demo

    console = make_console(streams.stdout)
    workdir = Path(args.workdir) if args.workdir else None
    if args.setup_only:
        if workdir is None:
            raise _Failure(EXIT_USAGE, "--setup-only needs --workdir DIR (where the project goes)")
        project = create_project(workdir)
        console.print(f"created the demo project in {project}; run the task with a real model:")
        for line in real_endpoint_commands(workdir)[1:]:
            console.print(f"  {line}")
        return EXIT_OK
    db = Path(args.db) if args.db else None
    outcome = await run_demo(console, workdir=workdir, db=db, slow=args.slow)
    return EXIT_OK if outcome.stop_reason is StopReason.COMPLETED else EXIT_RUN_FAILED


# -- sessions ------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> SQLiteSessionStore:
    return SQLiteSessionStore(args.db)


async def _sessions_list(args: argparse.Namespace, streams: _Streams) -> int:
    async with _store(args) as store:
        infos = await store.list(limit=args.limit)
    out = streams.stdout
    if args.json:
        for info in infos:
            out.write(info.model_dump_json() + "\n")
        return EXIT_OK
    if not infos:
        out.write(f"no sessions in {store.path}\n")
        return EXIT_OK
    rows = [
        (
            info.id,
            info.status,
            str(info.steps),
            info.updated_at.astimezone().strftime("%Y-%m-%d %H:%M"),
            info.agent,
            _one_line(info.title, 60),
        )
        for info in infos
    ]
    header = ("ID", "STATUS", "STEPS", "UPDATED", "AGENT", "TITLE")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
    out.write(f"{len(infos)} session(s) in {store.path}\n")
    return EXIT_OK


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


async def _sessions_show(args: argparse.Namespace, streams: _Streams) -> int:
    async with _store(args) as store:
        state = await store.load(args.id)
        events = await store.events(args.id)
    info, out = state.info, streams.stdout
    out.write(f"session {info.id}  ({info.status})\n")
    out.write(f"  title:    {_one_line(info.title, 100)}\n")
    out.write(f"  agent:    {info.agent}\n")
    out.write(
        f"  created:  {info.created_at.astimezone():%Y-%m-%d %H:%M:%S}   "
        f"updated: {info.updated_at.astimezone():%Y-%m-%d %H:%M:%S}\n"
    )
    out.write(
        f"  stored:   {info.steps} steps, {info.entry_count} history entries, "
        f"{info.event_count} events, environment version {info.environment_version}\n"
    )
    out.write(f"\nhistory ({len(state.entries)} entries)\n")
    for entry in state.entries:
        out.write(f"  {_entry_line(entry.model_dump(mode='json'))}\n")
    environment = state.environment
    if environment is not None:
        task = environment.task
        out.write("\nenvironment\n")
        out.write(f"  task:      {_one_line(task.objective, 90)} [{task.status.value}]\n")
        if task.plan:
            done = sum(step.completed for step in task.plan)
            out.write(f"  plan:      {done}/{len(task.plan)} steps done\n")
            for step in task.plan:
                out.write(f"    [{'x' if step.completed else ' '}] {step.description}\n")
        out.write(f"  files:     {len(environment.workspace.files)} known\n")
        out.write(f"  facts:     {len(environment.knowledge.discovered_facts)}\n")
        for fact in environment.knowledge.discovered_facts[-5:]:
            out.write(f"    - {_one_line(fact, 100)}\n")
        extensions = environment.get("/extensions")
        names = sorted(extensions) if isinstance(extensions, dict) else []
        out.write(f"  extensions: {', '.join(names) or '-'}\n")
        if args.environment:
            out.write(json.dumps(json.loads(environment.to_json()), indent=2) + "\n")
    runs: dict[str, list[str]] = {}
    for event in events:
        if event.kind == "run_started":
            runs.setdefault(event.run_id, []).insert(0, _one_line(event.task, 70))
        elif event.kind == "run_finished":
            runs.setdefault(event.run_id, []).append(
                f"{event.stop_reason}, {event.iterations} iteration(s)"
            )
    out.write(f"\nruns ({len(runs)})\n")
    for run_id, parts in runs.items():
        out.write(f"  {run_id[:8]}  {' -> '.join(parts)}\n")
    return EXIT_OK


def _entry_line(data: dict[str, object]) -> str:
    kind = str(data.get("kind", "?"))
    if kind == "tool_call":
        return f"{kind:12} {data.get('name')} {_one_line(str(data.get('arguments', '')), 80)}"
    if kind == "tool_result":
        flag = " (error)" if data.get("is_error") else ""
        body = _one_line(str(data.get("content", "")), 80)
        return f"{kind:12} {data.get('tool_name')}{flag}: {body}"
    return f"{kind:12} {_one_line(str(data.get('content', '')), 100)}"


async def _sessions_export(args: argparse.Namespace, streams: _Streams) -> int:
    async with _store(args) as store:
        if args.output:
            await store.export(args.id, args.output)
            streams.stderr.write(f"exported session {args.id} to {args.output}\n")
        else:
            await store.export(args.id, streams.stdout)
    return EXIT_OK


async def _sessions_import(args: argparse.Namespace, streams: _Streams) -> int:
    async with _store(args) as store:
        info = await store.import_(args.file, session_id=args.id)
    streams.stdout.write(
        f"imported session {info.id} ({info.entry_count} entries) into {store.path}\n"
    )
    return EXIT_OK


async def _sessions_delete(args: argparse.Namespace, streams: _Streams) -> int:
    async with _store(args) as store:
        await store.delete(args.id)
    streams.stdout.write(f"deleted session {args.id}\n")
    return EXIT_OK


# -- tools ---------------------------------------------------------------------------------


class _NoModel:
    """Stands in for the model where an agent is built only to see what it offers."""

    model = "none"

    async def complete(self, request: LLMRequest) -> Completion:
        raise UserError("this agent was built to list tools; it has no model to call")

    async def stream(self, request: LLMRequest) -> AsyncIterator[StreamEvent]:
        raise UserError("this agent was built to list tools; it has no model to call")
        yield  # pragma: no cover - makes this an async generator, as the protocol wants


async def _tools_command(args: argparse.Namespace, streams: _Streams) -> int:
    config = load_config(args.config)
    if args.model:
        config = config.model_copy(
            update={"llm": LLMConfig(model=args.model), "llm_overrides": None}
        )
    async with contextlib.AsyncExitStack() as stack:
        tools = await _tools(args, config, stack)
        agent = AgentExecutor(_NoModel(), config=config, tools=tools.executor)
        offered = agent.offered_tools()
        counter = agent.context.counter
        registered = tools.executor.tools
    out = streams.stdout
    if not offered:
        out.write("no tools are offered\n")
        return EXIT_OK
    rows = []
    for definition in offered:
        policy = registered[definition.name].policy
        traits = "read-only" if policy.read_only else f"{policy.risk.value} risk"
        if policy.requires_approval:
            traits += ", asks approval"
        source = tools.sources.get(
            definition.name, "control" if definition.name in _CONTROL else "config"
        )
        tokens = counter.count_tools([definition])
        rows.append((definition.name, source, traits, f"{tokens:,}"))
    header = ("TOOL", "FROM", "POLICY", "TOKENS")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        out.write(
            "  ".join(
                [
                    *(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=False)),
                    row[3].rjust(widths[3]),
                ]
            ).rstrip()
            + "\n"
        )
    total = counter.count_tools(offered)
    out.write(
        f"{len(offered)} tools; their schemas cost {total:,} tokens in every prompt "
        f"(counted with {counter.name})\n"
    )
    return EXIT_OK


_CONTROL = frozenset({"task_completion", "ask_question", "converse", "update_plan"})


if __name__ == "__main__":  # pragma: no cover - `python -m agent_flow.cli`
    sys.exit(main())
