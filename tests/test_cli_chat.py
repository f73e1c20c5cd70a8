"""`agent-flow chat` as a person uses it: through a pseudo-terminal, and through the line editor.

The pty tests run the installed script under pexpect, so the terminal is real: arrow keys
send escape sequences, Ctrl-C sends SIGINT while an answer is written, Ctrl-D ends input.
The in-process tests drive the same line editor through prompt_toolkit's pipe input, where a
test needs the command's own streams (approvals, Ctrl-C at the prompt).
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from agent_flow.cli import _chat
from agent_flow.cli._prompt import _LineEditor
from tests.openai_server import (
    OpenAIServer,
    RecordedRequest,
    Reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)
from tests.test_cli import agent_flow_script, invoke_async, model_flags

LEFT, UP, ESC_ENTER = "\x1b[D", "\x1b[A", "\x1b\r"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "AGENT_FLOW_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AGENT_FLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENT_FLOW_MODEL_RETRIES", "0")
    monkeypatch.setenv("AGENT_FLOW_LLM_OVERRIDES__MAX_RETRIES", "0")


def chat_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENT_FLOW_"))}
    env.update(
        PYTHONPATH=str(Path(__file__).resolve().parent.parent),
        AGENT_FLOW_HOME=str(home),
        AGENT_FLOW_MODEL_RETRIES="0",
        AGENT_FLOW_LLM_OVERRIDES__MAX_RETRIES="0",
        TERM="xterm-256color",
        # pexpect is a terminal that does not answer cursor-position requests; without this
        # prompt_toolkit waits for the answer before it draws the prompt.
        PROMPT_TOOLKIT_NO_CPR="1",
    )
    return env


class Terminal:
    """The chat under a pseudo-terminal; `expect` waits off the event loop."""

    def __init__(self, server: OpenAIServer, home: Path, db: Path, width: int = 80) -> None:
        self.child = pexpect.spawn(
            agent_flow_script(),
            ["chat", *model_flags(server), "--db", str(db)],
            env=chat_env(home),
            encoding="utf-8",
            dimensions=(30, width),
            timeout=60,
        )
        self.seen = io.StringIO()
        self.child.logfile_read = self.seen

    @property
    def screen(self) -> str:
        """What was printed, without the terminal's control sequences."""
        return re.sub(r"\x1b(\[[0-9;?]*[A-Za-z]|[=>])", "", self.seen.getvalue())

    async def expect(self, pattern: object) -> None:
        await asyncio.to_thread(self.child.expect, pattern)

    async def prompt(self) -> None:
        await self.expect("you>")

    async def leave(self) -> int:
        self.child.sendcontrol("d")
        await self.expect(pexpect.EOF)
        self.child.close()
        assert self.child.exitstatus is not None, self.seen.getvalue()
        return int(self.child.exitstatus)


def user_messages(body: dict[str, object]) -> list[object]:
    messages = body["messages"]
    assert isinstance(messages, list)
    return [m["content"] for m in messages if m["role"] == "user"]


async def test_arrow_keys_edit_the_line_and_never_reach_the_model(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(
        sse_reply(text_chunks("Hello **Ada**.\n\n- one\n- two")),
        sse_reply(text_chunks("Two lines received.")),
    )
    db = tmp_path / "s.db"
    terminal = Terminal(openai_server, tmp_path / "home", db)
    await terminal.prompt()
    # Type "abc", go left once, type "X": the line is "abXc".
    terminal.child.send(f"abc{LEFT}X\r")
    await terminal.expect("answered")
    await terminal.prompt()
    terminal.child.send(f"line one{ESC_ENTER}line two\r")
    await terminal.expect("Two lines received")
    await terminal.prompt()
    assert await terminal.leave() == 0

    first, second = openai_server.bodies
    assert user_messages(first) == ["abXc"]
    assert user_messages(second) == ["abXc", "line one\nline two"]
    assert all("\x1b" not in request.raw_body.decode() for request in openai_server.requests)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT title FROM sessions").fetchall() == [("abXc",)]
    screen = terminal.screen
    # The answer was rendered as Markdown (bullets), not shown as its source.
    assert "• one" in screen and "- one" not in screen
    assert "**Ada**" not in screen


async def test_messages_are_remembered_across_chats(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(
        sse_reply(text_chunks("Noted.")),
        sse_reply(text_chunks("Again.")),
    )
    home = tmp_path / "home"
    first = Terminal(openai_server, home, tmp_path / "a.db")
    await first.prompt()
    first.child.send("remember the milk\r")
    await first.expect("Noted")
    await first.prompt()
    assert await first.leave() == 0
    assert (home / "chat_history").is_file()

    second = Terminal(openai_server, home, tmp_path / "b.db")
    await second.prompt()
    second.child.send(f"{UP}\r")  # the last message of the earlier chat, sent again
    await second.expect("Again")
    await second.prompt()
    assert await second.leave() == 0
    assert user_messages(openai_server.bodies[1]) == ["remember the milk"]


async def test_ctrl_c_cancels_the_answer_and_the_chat_goes_on(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    asked = asyncio.Event()

    def hang(request: RecordedRequest) -> Reply:
        asked.set()
        return Reply(hang=True)

    openai_server.script(hang, sse_reply(text_chunks("Still here.")))
    terminal = Terminal(openai_server, tmp_path / "home", tmp_path / "s.db")
    await terminal.prompt()
    terminal.child.send("take your time\r")
    async with asyncio.timeout(60):
        await asked.wait()
    terminal.child.sendcontrol("c")
    await terminal.expect("cancelling this answer")
    await terminal.prompt()
    terminal.child.send("are you there?\r")
    await terminal.expect("Still here")
    await terminal.prompt()
    assert await terminal.leave() == 0
    assert user_messages(openai_server.bodies[1])[-1] == "are you there?"


async def test_ctrl_c_keeps_the_part_of_the_answer_already_written_dimmed_and_cut(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    written = "Once upon a time, there was"
    # The answer streams this far, then the server goes silent (no finish, no [DONE]).
    chunks = text_chunks(written, chunk_size=4, finish_reason=None, usage=None)
    openai_server.script(
        sse_reply(chunks, stall_after=len(chunks)), sse_reply(text_chunks("Go on?"))
    )
    terminal = Terminal(openai_server, tmp_path / "home", tmp_path / "s.db")
    await terminal.prompt()
    terminal.child.send("tell me a story\r")
    await terminal.expect("there was")  # the status line follows the writing
    terminal.child.sendcontrol("c")
    await terminal.expect("cancelling this answer")
    await terminal.expect(re.escape("[cut off here: the answer was cancelled]"))
    await terminal.prompt()
    terminal.child.send("and then?\r")
    await terminal.expect("Go on")
    await terminal.prompt()
    assert await terminal.leave() == 0
    raw = terminal.seen.getvalue()
    after = raw[raw.index("cancelling this answer") :]
    # Dimmed (SGR 2), whole, and before the mark that says it was cut.
    assert f"\x1b[2m{written}" in after
    assert after.index(written) < after.index("[cut off here")
    assert "cancelled · 1 step" in terminal.screen


async def test_long_lines_wrap_at_word_boundaries_to_the_terminal(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    words = " ".join(f"word{n:02d}" for n in range(40))
    openai_server.script(sse_reply(text_chunks(words)))
    terminal = Terminal(openai_server, tmp_path / "home", tmp_path / "s.db", width=50)
    await terminal.prompt()
    terminal.child.send("talk\r")
    await terminal.expect("word39")
    await terminal.prompt()
    assert await terminal.leave() == 0
    lines = [
        line.strip() for line in terminal.screen.split("\r\n") if line.strip().startswith("word")
    ]
    assert len(lines) > 1
    for line in lines:
        assert len(line) <= 50
        assert all(len(word) == 6 for word in line.split()), line  # no word was cut


# -- the line editor in-process, through prompt_toolkit's pipe input -----------------------


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[object]:
    """Keys typed into the chat's line editor (`send_text`), as at a terminal."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    with create_pipe_input() as pipe:
        editor = _LineEditor(tmp_path / "history", input=pipe, output=DummyOutput())
        monkeypatch.setattr(_chat, "_make_prompter", lambda streams: editor)
        yield pipe


async def test_ctrl_c_at_the_prompt_clears_the_line_and_ctrl_d_leaves(
    openai_server: OpenAIServer, tmp_path: Path, keys: object
) -> None:
    openai_server.script(sse_reply(text_chunks("Got it.")))
    keys.send_text("a draft I regret\x03the real message\r\x04")  # type: ignore[attr-defined]
    result = await invoke_async(["chat", *model_flags(openai_server), "--db", str(tmp_path / "d")])
    assert result.code == 0, result.err
    assert "Got it." in result.out
    assert [user_messages(body) for body in openai_server.bodies] == [["the real message"]]


async def test_an_approval_is_answered_in_the_line_editor(
    openai_server: OpenAIServer, tmp_path: Path, keys: object
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    openai_server.script(
        sse_reply(tool_call_chunks([("w1", "write_file", '{"path": "a.txt", "content": "x"}')])),
        sse_reply(text_chunks("Written.")),
    )
    keys.send_text("write it\ry\r\x04")  # type: ignore[attr-defined]
    result = await invoke_async(
        [
            "chat",
            *model_flags(openai_server),
            "--workspace",
            str(workspace),
            "--db",
            str(tmp_path / "d"),
        ]
    )
    assert result.code == 0, result.err
    assert "approved: write_file (approved at the terminal)" in result.out
    assert (workspace / "a.txt").read_text() == "x"


def test_chat_help_says_how_to_edit_and_leave(capsys: pytest.CaptureFixture[str]) -> None:
    from agent_flow.cli import main

    assert main(["chat", "--help"]) == 0
    text = capsys.readouterr().out
    assert "new line" in text and "Ctrl-D" in text and "Ctrl-C" in text
