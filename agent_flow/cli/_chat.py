"""`agent-flow chat`: a conversation with an agent over one session, message after message.

At a terminal the messages are typed into a line editor (`agent_flow.cli._prompt`): editing,
history across chats, multi-line messages; Ctrl-C cancels the answer being written (the part
already written stays, dimmed and marked cut) and the chat goes on, Ctrl-D leaves. Elsewhere
(a pipe, a file) each line is a message. Each answer is shown as the run command shows it:
the reading mode by default, ``--trace``, ``-q`` or ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from agent_flow.agent import ExecutionOutcome, StopReason
from agent_flow.cli._exit import EXIT_CANCELLED, EXIT_OK, _error_line, _Streams
from agent_flow.cli._interactive import _Interrupts, _read_or_stop
from agent_flow.cli._prompt import EDITING_HELP, _isatty, _Prompter
from agent_flow.cli._run import (
    _exit_code,
    _failure_message,
    _forget_if_empty,
    _model_name,
    _open_session,
    _Session,
)
from agent_flow.sessions import store_location

_COMMANDS_HELP = "/env shows the environment, /exit (or end of input) leaves"


def _make_prompter(streams: _Streams) -> _Prompter | None:
    """The line editor when a person is at a terminal; None for plain lines from stdin."""
    if not (_isatty(streams.stdin) and _isatty(streams.stdout)):
        return None
    from agent_flow.cli._prompt import _LineEditor, chat_history_path

    return _LineEditor(chat_history_path())


async def _chat_command(args: argparse.Namespace, streams: _Streams) -> int:
    async with contextlib.AsyncExitStack() as stack:
        editor = _make_prompter(streams)
        session = await _open_session(args, streams, stack, prompter=editor)
        agent, say = session.agent, session.renderer.line
        help_text = f"{_COMMANDS_HELP}; {EDITING_HELP}" if editor is not None else _COMMANDS_HELP
        stop = asyncio.Event()
        turn: asyncio.Task[ExecutionOutcome] | None = None

        def interrupt() -> None:
            if turn is not None and not turn.done():
                say("cancelling this answer… (Ctrl-C again quits)", "yellow")
                agent.cancel()
            else:
                stop.set()

        started = session.resumed
        fresh = not session.resumed
        code = EXIT_OK
        what = f"session {args.session}" if session.resumed else "a new session"
        say(
            f"chat with {_model_name(session.llm)} in {what}; type a message, /help for "
            "keys and commands",
            "dim",
        )
        with _Interrupts(interrupt) as interrupts:
            while True:
                line = await _read_or_stop(session.prompter.message("you> "), stop)
                if stop.is_set():
                    _end_prompt_line(session, editor is None)
                    code = EXIT_CANCELLED
                    break
                if line is None:
                    _end_prompt_line(session, editor is None)
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
                    say(help_text)
                    continue
                turn = asyncio.ensure_future(agent.send(message) if started else agent.run(message))
                started = True
                outcome = await turn
                turn = None
                interrupts.count = 0
                code = await _turn_report(outcome, session, streams, fresh=fresh)
                fresh = fresh and agent.session_id is None
        if agent.session_id is not None:
            say(f"session {agent.session_id} saved in {store_location(session.store)}", "dim")
        return code


def _end_prompt_line(session: _Session, plain: bool) -> None:
    """End the line a plain prompt left open (the line editor ends its own)."""
    if plain and session.mode != "quiet":
        session.renderer.line("")


async def _turn_report(
    outcome: ExecutionOutcome, session: _Session, streams: _Streams, *, fresh: bool
) -> int:
    """Say how one answer ended; a cancelled answer is not a failure of the chat."""
    if outcome.stop_reason is StopReason.WAITING_FOR_USER and session.mode != "quiet":
        session.renderer.line(f"the agent asks: {outcome.final_text}", "bold")
    await _forget_if_empty(session, fresh=fresh)
    message = _failure_message(outcome)
    if message is not None:
        _error_line(streams, message)
    code = _exit_code(outcome)
    return EXIT_OK if code == EXIT_CANCELLED else code
