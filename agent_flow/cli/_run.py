"""The commands that run an agent: `run` (one task), `chat` (a REPL over one session), `demo`.

`_open_session` builds what `run` and `chat` share (config, model, store, tools, approvals,
rendering); `_report` says how a run ended and how to continue it. The openai SDK and rich
are imported here only when a command runs, so ``agent-flow --help`` does not load them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent_flow import errors
from agent_flow.agent import AgentExecutor, ExecutionOutcome, StopReason
from agent_flow.cli._build import _agent_config, _check_credentials, _llm_config, _tools
from agent_flow.cli._exit import (
    EXIT_CANCELLED,
    EXIT_MODEL,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    _error_line,
    _Failure,
    _Streams,
)
from agent_flow.cli._interactive import _Approver, _Interrupts, _LineReader, _read_or_stop
from agent_flow.environment import Environment, SystemState
from agent_flow.errors import ModelError
from agent_flow.sessions import SQLiteSessionStore

if TYPE_CHECKING:
    from agent_flow.cli.render import EventRenderer
    from agent_flow.llm import OpenAIClient

_OK_REASONS = frozenset(
    {StopReason.COMPLETED, StopReason.ANSWERED, StopReason.CONVERSE, StopReason.WAITING_FOR_USER}
)


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
    # Imported here, not at the top: `agent-flow --help` needs neither the openai SDK nor rich.
    from agent_flow.cli.render import EventRenderer, JsonLinesWriter, make_console
    from agent_flow.llm import OpenAIClient

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
    approver = _Approver(
        auto=args.yes or args.yes_all,
        auto_high_risk=args.yes_all,
        reader=reader,
        stdin=streams.stdin,
        renderer=renderer,
    )
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


async def _demo_command(args: argparse.Namespace, streams: _Streams) -> int:
    from agent_flow._demo.scenario import create_project, real_endpoint_commands, run_demo
    from agent_flow.cli.render import make_console

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
