"""The commands that run an agent: `run` (one task) and `demo`; `chat` is in `_chat`.

`_open_session` builds what `run` and `chat` share (config or the user's own agent, model,
store, tools, approvals, and the output mode: reading, ``--trace``, ``-q`` or ``--json``);
`_report` says how a run ended and how to continue it. The openai SDK and rich are imported
here only when a command runs, so ``agent-flow --help`` does not load them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from agent_flow import errors
from agent_flow.agent import AgentExecutor, ExecutionOutcome, StopReason
from agent_flow.cli._build import (
    _agent_config,
    _check_budget,
    _check_credentials,
    _fit_to_server_context,
    _llm_config,
    _load_config,
    _start_agent,
    _tools,
    _warn_if_server_context_is_smaller,
)
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
from agent_flow.cli._interactive import _Approver, _Interrupts
from agent_flow.cli._prompt import _isatty, _PlainPrompter, _Prompter
from agent_flow.cli._sessions import _check_db, _store
from agent_flow.environment import Environment, SystemState
from agent_flow.errors import ModelError, StoreError
from agent_flow.llm.base import LLMClient
from agent_flow.sessions import SessionRecorder, SessionStore, store_location

if TYPE_CHECKING:
    from agent_flow.cli._reading import QuietRenderer, ReadingRenderer
    from agent_flow.cli.render import EventRenderer

_OK_REASONS = frozenset(
    {StopReason.COMPLETED, StopReason.ANSWERED, StopReason.CONVERSE, StopReason.WAITING_FOR_USER}
)

Mode = Literal["read", "trace", "quiet", "json"]


@dataclass
class _Session:
    agent: AgentExecutor
    llm: LLMClient
    store: SessionStore
    renderer: EventRenderer | ReadingRenderer | QuietRenderer
    resumed: bool
    prompter: _Prompter
    mode: Mode


def _mode(args: argparse.Namespace) -> Mode:
    if args.json:
        return "json"
    if getattr(args, "quiet", False):
        return "quiet"
    return "trace" if getattr(args, "trace", False) else "read"


def _model_name(llm: LLMClient) -> str:
    return str(getattr(llm, "model", "") or type(llm).__name__)


async def _open_session(
    args: argparse.Namespace,
    streams: _Streams,
    stack: contextlib.AsyncExitStack,
    *,
    prompter: _Prompter | None = None,
) -> _Session:
    """Everything `run` and `chat` share: config, model, store, tools, approvals, rendering.

    Args:
        args: The flags.
        streams: The command's streams.
        stack: Closes what is opened here.
        prompter: Who approvals ask (default: lines from stdin).
    """
    # Imported here, not at the top: `agent-flow --help` needs neither the openai SDK nor rich.
    from agent_flow.cli._reading import QuietRenderer, ReadingRenderer
    from agent_flow.cli._user_agent import load_user_agent
    from agent_flow.cli.render import EventRenderer, JsonLinesWriter, make_console
    from agent_flow.llm import OpenAIClient

    def warn(message: str) -> None:
        streams.stderr.write(f"agent-flow: warning: {message}\n")

    _check_db(args.db)
    built: list[OpenAIClient] = []

    def model_from_flags() -> OpenAIClient:
        # For an --agent function that takes `llm`: the model of the flags (and AGENT_FLOW_*).
        llm_config = _llm_config(_load_config(None, warn), args)
        _check_credentials(llm_config, args.api_key_env, args.base_url)
        client = OpenAIClient.from_config(llm_config)
        stack.push_async_callback(client.aclose)
        built.append(client)
        return client

    own = (
        await load_user_agent(args.agent, llm=model_from_flags if _model_flags(args) else None)
        if args.agent
        else None
    )
    if isinstance(own, AgentExecutor):
        given_llm = bool(built) and own.llm is built[0]
        _refuse_flags_for_an_executor(args, model_flags_taken=given_llm)
        config, llm = own.config, own.llm
        if not given_llm:
            _close_at_exit(llm, stack)
        if isinstance(llm, OpenAIClient):
            await _warn_if_server_context_is_smaller(llm, own.context.max_tokens, args, warn)
    else:
        config = _agent_config(args, warn, base=own)
        llm_config = _llm_config(config, args)
        _check_credentials(llm_config, args.api_key_env, args.base_url)
        config = config.model_copy(update={"llm": llm_config, "llm_overrides": None})
        client = OpenAIClient.from_config(llm_config)
        stack.push_async_callback(client.aclose)
        llm = client
        config = await _fit_to_server_context(config, client, llm_config.provider, args, warn)
    store = await stack.enter_async_context(_store(args))
    tools = _tools(args, config, into=own.tools if isinstance(own, AgentExecutor) else None)
    config = tools.config
    mode = _mode(args)
    console = make_console(streams.stderr if mode in ("json", "quiet") else streams.stdout)
    renderer: EventRenderer | ReadingRenderer | QuietRenderer
    if mode == "quiet":
        renderer = QuietRenderer(streams.stdout, console)
    elif mode == "read":
        renderer = ReadingRenderer(console)
    else:
        # The command's error line states a fatal error once; the trace only marks it.
        renderer = EventRenderer(console, fatal_detail=False)
    asker = prompter if prompter is not None else _PlainPrompter(streams.stdin, console)
    approver = _Approver(
        auto=args.yes or args.yes_all,
        auto_high_risk=args.yes_all,
        prompter=asker,
        before_asking=renderer.stop_spinner,
    )
    if args.session:
        agent = await AgentExecutor.resume(
            store,
            args.session,
            llm,
            config=config,
            tools=tools.executor,
            approval=approver,
            output_type=own.output_type if isinstance(own, AgentExecutor) else None,
        )
    elif isinstance(own, AgentExecutor):
        agent = own
        # The flags' MCP servers join the agent's own; it starts them all when entered.
        agent.config = config
        agent.approval = approver
        if agent.recorder is None:
            agent.recorder = recorder = SessionRecorder(store)
            recorder.cancels(agent.cancel)
        if tools.workspace is not None and not agent.environment.system.working_directory:
            agent.environment.update_section("system", working_directory=str(tools.workspace.root))
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
        agent = AgentExecutor.from_config(
            config,
            llm=llm,
            tools=tools.executor,
            environment=environment,
            approval=approver,
            store=store,
        )
    await _start_agent(agent, tools, stack)
    _export_telemetry(agent, args, stack)
    _check_budget(
        lambda: agent.context.history_budget(tools=agent.offered_tools()),
        args,
        agent.context.max_tokens,
    )
    if mode == "json":
        agent.events.on(None, JsonLinesWriter(streams.stdout))  # every event, `path` and all
    elif mode == "trace":
        agent.events.on(None, renderer)  # a delegated child's events too, under its run id
    else:
        # The answer and the status line are the top-level run's: a delegated child's events
        # (their `path` names the parent run) are not the user's answer.
        agent.events.on(None, lambda event: None if event.path else renderer(event))
    return _Session(agent, llm, store, renderer, bool(args.session), asker, mode)


_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def _export_telemetry(
    agent: AgentExecutor, args: argparse.Namespace, stack: contextlib.AsyncExitStack
) -> None:
    """With ``--otel`` (or an OTLP endpoint in the environment), export the run over OTLP."""
    if not (args.otel or any(os.environ.get(name) for name in _OTLP_ENDPOINTS)):
        return
    # Imported here: the telemetry ring and OpenTelemetry only for runs that export.
    from agent_flow.telemetry import configure_otlp, instrument

    export = configure_otlp()
    stack.callback(export.shutdown)  # flushes what is buffered when the command ends
    instrument(agent)


def _close_at_exit(llm: object, stack: contextlib.AsyncExitStack) -> None:
    """Close an --agent's model client when the command ends (it lives as long)."""
    close = getattr(llm, "aclose", None)
    if callable(close):
        stack.push_async_callback(close)


_MODEL_FLAGS = ("model", "base_url", "provider", "api_key_env", "timeout")


def _model_flags(args: argparse.Namespace) -> bool:
    """Whether any flag that describes the model was given."""
    return any(getattr(args, name, None) is not None for name in _MODEL_FLAGS)


def _refuse_flags_for_an_executor(
    args: argparse.Namespace, *, model_flags_taken: bool = False
) -> None:
    """Refuse the flags an `AgentExecutor` from ``--agent`` cannot take.

    Args:
        args: The flags.
        model_flags_taken: Its function took the model the flags describe (an ``llm``
            parameter), so those flags are honoured.
    """
    model = [
        ("--model", args.model),
        ("--base-url", args.base_url),
        ("--provider", getattr(args, "provider", None)),
        ("--api-key-env", args.api_key_env),
        ("--timeout", getattr(args, "timeout", None)),
    ]
    rest = [
        ("--config", args.config),
        ("--max-iterations", args.max_iterations),
        ("--budget", args.budget),
    ]
    given_model = [flag for flag, value in model if value is not None]
    given_rest = [flag for flag, value in rest if value is not None]
    if given_model and not model_flags_taken:
        raise _Failure(
            EXIT_USAGE,
            f"--agent {args.agent} is an AgentExecutor with its own model, which "
            f"{', '.join(given_model)} cannot change; give --agent a function with an llm "
            "parameter (def build_agent(llm=None): ...) to take the model of these flags",
        )
    if given_rest:
        raise _Failure(
            EXIT_USAGE,
            f"--agent {args.agent} is an AgentExecutor with its own config, which "
            f"{', '.join(given_rest)} cannot change; return an AgentConfig (or build the agent "
            "from one) to take these flags",
        )


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


async def _forget_if_empty(session: _Session, *, fresh: bool) -> bool:
    """Delete the session this command created if the store holds nothing of it; say so.

    The CLI never deletes what it stored. A run saves its task, its events and how it ended
    when it ends, whatever stopped it: one cut off mid-answer keeps the text it received, one
    that never reached the model keeps the errors saying why, and both can be resumed. So only
    a session with nothing stored beyond its creation (no step, no history entry, no event)
    is forgotten, which happens when the store failed to save the run's end; a resume hint for
    it could not help. A session that existed before (`fresh` false) is always kept.
    """
    agent = session.agent
    if not fresh or agent.session_id is None or agent.store is not session.store:
        return False
    try:
        info = await session.store.info(agent.session_id)
        if info.steps or info.entry_count or info.event_count:
            return False
        await session.store.delete(agent.session_id)
    except StoreError:
        return False  # a store that cannot say or delete keeps what it has
    # A later message in a chat starts a new session rather than writing to the deleted one.
    recorder = SessionRecorder(session.store)
    recorder.cancels(agent.cancel)
    agent.recorder = recorder
    return True


async def _report(outcome: ExecutionOutcome, session: _Session, streams: _Streams) -> int:
    """Print how the run ended and how to continue; return the exit code."""
    say = session.renderer.line
    message = _failure_message(outcome)
    if await _forget_if_empty(session, fresh=not session.resumed):
        # The error line says what is wrong, once; nothing was kept to continue.
        if message is not None:
            _error_line(streams, message)
        return _exit_code(outcome)
    session_id = session.agent.session_id or "?"
    if session.agent.store is not session.store:  # an --agent with a store of its own
        if message is not None:
            _error_line(streams, message)
        return _exit_code(outcome)
    where = shlex.quote(store_location(session.store))
    again = f"agent-flow run --session {session_id} --db {where}"
    reason = outcome.stop_reason
    if session.mode == "quiet":
        if reason not in _OK_REASONS and reason is not StopReason.ERROR:
            _error_line(streams, f'the run stopped: {reason.value}; continue with  {again} "..."')
    elif reason is StopReason.WAITING_FOR_USER:
        say(f"the agent asks: {outcome.final_text}", "bold")
        say(f'answer with:  {again} "your answer"')
    elif reason is StopReason.CANCELLED:
        say(f'cancelled; the session is kept: continue with  {again} "..."', "yellow")
    elif reason is StopReason.ERROR:
        say(f'the session is kept; once fixed, continue with  {again} "..."', "dim")
    elif reason not in _OK_REASONS:
        say(f'the run stopped: {reason.value}; continue with  {again} "..."', "yellow")
    if session.mode == "json" or (session.mode != "quiet" and reason in _OK_REASONS):
        say(f"session {session_id} saved in {store_location(session.store)}", "dim")
    if message is not None:
        _error_line(streams, message)
    return _exit_code(outcome)


async def _read_task(args: argparse.Namespace, streams: _Streams) -> str:
    """The task: the argument, with what is piped into stdin after it (or stdin alone)."""
    task: str = args.task or ""
    piped = ""
    if not _isatty(streams.stdin):
        with contextlib.suppress(OSError, ValueError):
            piped = await asyncio.to_thread(streams.stdin.read)
    if piped.strip():
        task = f"{task}\n\n{piped.rstrip()}" if task.strip() else piped.rstrip()
    if not task.strip():
        raise _Failure(
            EXIT_USAGE,
            'run needs a task: agent-flow run "what to do" (or pipe text in: '
            'cat notes.txt | agent-flow run "summarize this")',
        )
    return task


# -- commands ------------------------------------------------------------------------------


async def _run_command(args: argparse.Namespace, streams: _Streams) -> int:
    task = await _read_task(args, streams)
    async with contextlib.AsyncExitStack() as stack:
        session = await _open_session(args, streams, stack)
        agent = session.agent

        def cancel() -> None:
            session.renderer.line("cancelling… (Ctrl-C again quits at once)", "yellow")
            agent.cancel()

        with _Interrupts(cancel):
            if session.resumed:
                outcome = await agent.send(task)
            else:
                outcome = await agent.run(task)
        return await _report(outcome, session, streams)


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
    _check_db(args.db)
    db = Path(args.db) if args.db else None
    outcome = await run_demo(console, workdir=workdir, db=db, slow=args.slow)
    return EXIT_OK if outcome.stop_reason is StopReason.COMPLETED else EXIT_RUN_FAILED
