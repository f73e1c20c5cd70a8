"""The ``agent-flow`` argument parser: the commands, their options and the epilog.

Each command's parser names its handler (``handler=``), which `agent_flow.cli._main.main`
runs. The handlers' modules import the heavy dependencies (the openai SDK, MCP, rich) only
when a command runs, so ``--help`` and ``--version`` stay quick.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import NoReturn

from agent_flow._defaults import DEFAULT_REPLAY_MAX_WAIT, DEMO_SERVE_PACE
from agent_flow.cli._exit import EXIT_USAGE, _Streams
from agent_flow.cli._lab_args import add_lab_arguments
from agent_flow.cli._prompt import EDITING_HELP
from agent_flow.llm.config import PROVIDER_DEFAULTS
from agent_flow.sessions import default_store_path

_Handler = Callable[[argparse.Namespace, _Streams], Coroutine[None, None, int]]

_EPILOG = """\
exit codes:
  0    the run finished: task completed, answered, or the agent waits for your reply
  1    the run ended without finishing (a limit, stuck, invalid output) or the store failed
  2    usage or configuration error: bad flag, config key or AGENT_FLOW_* value, no API
       key, unknown session, a budget too small for the tools, a workspace, store or MCP
       server that cannot be used
  3    the model endpoint failed: unreachable, timed out, refused the key or the request
  130  cancelled with Ctrl-C (the session is kept: continue it with --session ID)
  143  run or chat stopped by SIGTERM (the session is kept, as with Ctrl-C)

environment:
  OPENAI_API_KEY   the API key (or name another variable with --api-key-env)
  OPENAI_BASE_URL  the endpoint when --base-url is not given
  AGENT_FLOW_*     config overrides, e.g. AGENT_FLOW_CONTEXT__MAX_TOKENS=16000
  AGENT_FLOW_HOME  where the session store lives (default ~/.local/share/agent_flow)

Start with `agent-flow demo`: a complete agent run, offline, with no API key.
"""


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


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 seconds")
    return value


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be 0 (no pauses) or more")
    return value


def _agent_options() -> _Parser:
    options = _Parser(add_help=False)
    model = options.add_argument_group("model")
    model.add_argument("--model", help="the model name the endpoint knows (e.g. gpt-4o-mini)")
    model.add_argument(
        "--base-url",
        help="an OpenAI-compatible endpoint, e.g. http://localhost:11434/v1 (default: "
        "OPENAI_BASE_URL; without either, give --provider)",
    )
    model.add_argument(
        "--provider",
        choices=sorted(PROVIDER_DEFAULTS),
        help="the kind of server, filling in its base URL and key variable (e.g. openai for "
        "OpenAI's own API; default openai_compatible, which needs a base URL)",
    )
    model.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="the environment variable holding the API key (default OPENAI_API_KEY)",
    )
    model.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="the most one model call attempt may take in all (default 600; connecting 10, "
        "a streamed answer's start 120, silence between its chunks 60, each capped by this)",
    )
    agent = options.add_argument_group("agent")
    agent.add_argument("--config", metavar="FILE", help="an agent.toml file ([agent], [llms.*])")
    agent.add_argument("--agent", metavar="MODULE:ATTR", help=_AGENT_HELP)
    agent.add_argument(
        "--workspace", metavar="DIR", help="give the agent the built-in file tools on DIR"
    )
    _mcp_options(agent)
    agent.add_argument("--max-iterations", type=_positive, metavar="N", help="model calls per run")
    agent.add_argument(
        "--budget", type=_positive, metavar="TOKENS", help="the hard token budget of every prompt"
    )
    agent.add_argument("--session", metavar="ID", help="continue this stored session")
    agent.add_argument(
        "--yes",
        action="store_true",
        help="approve tool calls that ask, except high-risk ones (run_command, destructive MCP "
        "tools): those are asked at the terminal, or refused without one",
    )
    agent.add_argument(
        "--yes-all",
        action="store_true",
        help="approve every tool call that asks, high-risk ones included (shell commands run "
        "unconfined unless bubblewrap is installed: see `agent-flow tools`)",
    )
    agent.add_argument("--db", metavar="PATH|URL", help=_db_help())
    agent.add_argument(
        "--otel",
        action="store_true",
        help="export the run as OpenTelemetry GenAI traces and metrics over OTLP/HTTP, to "
        "OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318); on by itself when that "
        "variable is set; needs: pip install 'agent-flow[otel]'",
    )
    output = options.add_argument_group(
        "output (default: a status line while it runs, then the answer as Markdown)"
    ).add_mutually_exclusive_group()
    output.add_argument(
        "--trace", action="store_true", help="print every event: tools, context bar, changes"
    )
    output.add_argument(
        "-q", "--quiet", action="store_true", help="print the answer alone (for scripts)"
    )
    output.add_argument(
        "--json", action="store_true", help="print events as JSON lines instead of rendering"
    )
    return options


_AGENT_HELP = (
    "your own agent, defined in Python: an AgentExecutor, an AgentConfig, or a function "
    "returning one (my_agents:build, or path/to/file.py:agent)"
)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from err
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 seconds")
    return value


def _mcp_options(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar='"[name=][VAR=value ...] COMMAND ARGS"',
        help="an MCP server started over stdio (repeatable); its tools are named NAME_tool; "
        "UPPER_CASE=value words before the command are its environment, as in the shell",
    )
    group.add_argument(
        "--mcp-env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="an environment variable for every stdio MCP server (repeatable); NAME alone "
        "passes on this process's value (servers otherwise get only HOME, PATH, SHELL, TERM...)",
    )
    group.add_argument(
        "--mcp-http",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="an MCP server reached over streamable HTTP (repeatable)",
    )
    group.add_argument(
        "--mcp-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="how long an MCP server may take to start, and to answer a call (default 30 s "
        "to start, 60 s per call)",
    )


def _logging_options(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: the flags may come before or after the command without one hiding the other.
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more to stderr: -v library and MCP server messages, -vv debug details "
        "with tracebacks",
    )
    parser.add_argument(
        "--log-file",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="write the log (with tracebacks) to FILE instead of stderr",
    )


def _db_hint() -> str:
    try:
        return str(default_store_path())
    except RuntimeError:  # no home directory
        return "$AGENT_FLOW_HOME/sessions.db"


def _db_help() -> str:
    return (
        "the session store: a SQLite file, or postgresql://user@host/db[?schema=name] "
        f"(default: [store] url of --config, else {_db_hint()})"
    )


def _handler(module: str, name: str) -> _Handler:
    """The command `name` of `module`, imported when the command runs (not for ``--help``)."""

    async def handler(args: argparse.Namespace, streams: _Streams) -> int:
        command: _Handler = getattr(importlib.import_module(module), name)
        return await command(args, streams)

    handler.__qualname__ = handler.__name__ = name
    return handler


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
    _logging_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    agent_options = _agent_options()
    db = _Parser(add_help=False)
    db.add_argument("--db", metavar="PATH|URL", help=_db_help())
    db.add_argument("--config", metavar="FILE", help="an agent.toml file whose [store] url to use")

    def sub(name: str, help: str, parents: Sequence[_Parser] = ()) -> _Parser:
        command: _Parser = commands.add_parser(
            name,
            help=help,
            description=help,
            parents=list(parents),
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _logging_options(command)
        return command

    run = sub("run", "run an agent on a task until it finishes", [agent_options])
    run.add_argument(
        "task",
        nargs="?",
        help="what the agent should do (or your reply, with --session); text piped into "
        "stdin is added after it, or is the task when none is given",
    )
    run.set_defaults(handler=_handler("agent_flow.cli._run", "_run_command"), stop_on_sigterm=True)

    chat = sub("chat", "talk with an agent over one session, message by message", [agent_options])
    chat.description = f"Talk with an agent over one session. At a terminal: {EDITING_HELP}."
    chat.set_defaults(
        handler=_handler("agent_flow.cli._chat", "_chat_command"), stop_on_sigterm=True
    )

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
    demo.set_defaults(handler=_handler("agent_flow.cli._run", "_demo_command"))

    sessions = sub("sessions", "list, show, export, import or delete stored sessions")
    actions = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the most recent sessions", parents=[db])
    listing.add_argument("--limit", type=_positive, default=20, help="how many (default 20)")
    listing.add_argument("--json", action="store_true", help="one JSON object per session")
    listing.set_defaults(handler=_handler("agent_flow.cli._sessions", "_sessions_list"))
    show = actions.add_parser(
        "show", help="a session's history, environment and runs", parents=[db]
    )
    show.add_argument("id")
    show.add_argument("--environment", action="store_true", help="print the environment as JSON")
    show.set_defaults(handler=_handler("agent_flow.cli._sessions", "_sessions_show"))
    export = actions.add_parser("export", help="a session as JSON lines", parents=[db])
    export.add_argument("id")
    export.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    export.set_defaults(handler=_handler("agent_flow.cli._sessions", "_sessions_export"))
    imported = actions.add_parser("import", help="store a session from an export", parents=[db])
    imported.add_argument("file")
    imported.add_argument("--id", help="store it under this id (default: the exported one)")
    imported.set_defaults(handler=_handler("agent_flow.cli._sessions", "_sessions_import"))
    delete = actions.add_parser("delete", help="delete a session", parents=[db])
    delete.add_argument("id")
    delete.set_defaults(handler=_handler("agent_flow.cli._sessions", "_sessions_delete"))
    diff = actions.add_parser(
        "diff",
        help="compare two sessions' environments and per-step prompt budgets",
        parents=[db],
    )
    diff.add_argument("a", metavar="A", help="a session id, or a file from `sessions export`")
    diff.add_argument("b", metavar="B", help="the session to compare it with (id or file)")
    diff.add_argument("--json", action="store_true", help="the comparison as one JSON object")
    diff.set_defaults(handler=_handler("agent_flow.cli._diff", "_sessions_diff"))

    replay = sub("replay", "render a stored session's events again, paced as they happened", [db])
    replay.add_argument(
        "session", metavar="SESSION", help="a session id, or a file from `sessions export`"
    )
    replay.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        metavar="X",
        help="how many times faster than recorded (default 1; 0: no pauses)",
    )
    replay.add_argument(
        "--max-wait",
        type=_seconds,
        default=DEFAULT_REPLAY_MAX_WAIT,
        metavar="SECONDS",
        help=f"the longest pause between two events (default {DEFAULT_REPLAY_MAX_WAIT:g})",
    )
    replay.add_argument("--json", action="store_true", help="every event as a JSON line")
    replay.set_defaults(handler=_handler("agent_flow.cli._replay", "_replay_command"))

    lab = sub(
        "lab", "replay recorded sessions under candidate pruning strategies and budgets", [db]
    )
    add_lab_arguments(lab, seconds=_positive_seconds)
    lab.set_defaults(handler=_handler("agent_flow.cli._lab", "_lab_command"))

    serve = sub("serve", "serve sessions over HTTP with live event streams (SSE)", [db])
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve.add_argument(
        "--token",
        help="bearer token every request must carry (default $AGENT_FLOW_SERVER_TOKEN, else a "
        "random one, printed once in the inspector's address); its holder is the admin",
    )
    serve.add_argument(
        "--tokens-file",
        metavar="FILE",
        help="a TOML file of [users.NAME] tables (token or token_sha256, admin): each user "
        "sees only its own sessions (default $AGENT_FLOW_SERVER_TOKENS_FILE)",
    )
    serve.add_argument(
        "--no-token",
        action="store_true",
        help="serve without any token (loopback only; any local program or user may then "
        "drive the agent)",
    )
    serve.add_argument(
        "--server-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients reach the server by (repeatable; IP addresses and "
        "localhost always work; '*' accepts any, only behind a proxy that checks Host)",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from this origin call the API (repeatable)",
    )
    serve.add_argument(
        "--allow-client-endpoints",
        action="store_true",
        help="let a session name its own model endpoint (base_url); such a session sends "
        "no key (default: only the configured endpoints)",
    )
    serve.add_argument(
        "--workspace-root",
        action="append",
        default=[],
        metavar="DIR",
        help="sessions may choose a workspace under this directory (repeatable)",
    )
    serve.add_argument(
        "--otel",
        action="store_true",
        help="export every run as OpenTelemetry GenAI traces and metrics over OTLP/HTTP (as "
        "the agent command's --otel); a request's W3C traceparent makes its run part of the "
        "caller's trace",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="serve the offline scripted run of `agent-flow demo` (no model server, no key): "
        "its run starts at once in session 'demo'; watch it in the inspector",
    )
    serve.add_argument(
        "--demo-pace",
        type=_speed,
        default=DEMO_SERVE_PACE,
        metavar="SECONDS",
        help="with --demo: seconds between the scripted model's streamed chunks (default "
        f"{DEMO_SERVE_PACE:g}; 0: as fast as it goes)",
    )
    serve.set_defaults(handler=_handler("agent_flow.cli._serve", "_serve_command"))

    worker = sub("worker", "execute durable runs from the DBOS queue (agent-flow[durable])", [db])
    worker.add_argument(
        "--system-db",
        metavar="URL",
        help="DBOS's system database (default: [durable] system_database_url of --config, "
        "else a local SQLite file)",
    )
    worker.add_argument(
        "--concurrency", type=_positive, help="runs this worker executes at once (default: any)"
    )
    worker.add_argument(
        "--executor-id", help="this worker's DBOS executor id (default: a new one per start)"
    )
    worker.add_argument(
        "--otel",
        action="store_true",
        help="export every run as OpenTelemetry GenAI traces and metrics over OTLP/HTTP (as "
        "serve's --otel; on by itself when OTEL_EXPORTER_OTLP_ENDPOINT is set); a run joins "
        "the trace of the request that enqueued it",
    )
    worker.set_defaults(handler=_handler("agent_flow.cli._worker", "_worker_command"))

    tools = sub(
        "tools",
        "list the tools an agent would be offered, with the tokens their schemas cost",
        [_tools_options()],
    )
    tools.set_defaults(handler=_handler("agent_flow.cli._tools", "_tools_command"))
    _refuse_empty_values(parser)
    return parser


def _given(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty value (an unset shell variable?); give one, or leave the flag out"
        )
    return text


def _refuse_empty_values(parser: argparse.ArgumentParser) -> None:
    """Make every flag that takes free text refuse an empty one, in every command.

    No flag means anything by an empty value, and taking it as the flag left out hides a
    mistake: ``--session "$ID"`` with ``ID`` unset would start a new session.
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                _refuse_empty_values(command)
        elif (
            isinstance(action, argparse._StoreAction)
            and action.option_strings
            and action.nargs is None
            and action.type is None
            and action.choices is None
        ):
            action.type = _given


def _tools_options() -> _Parser:
    options = _Parser(add_help=False)
    options.add_argument("--config", metavar="FILE", help="an agent.toml file")
    options.add_argument("--workspace", metavar="DIR", help="include the built-in file tools")
    _mcp_options(options)
    options.add_argument("--model", help="count tokens with this model's tokenizer")
    options.add_argument("--agent", metavar="MODULE:ATTR", help=_AGENT_HELP)
    return options
