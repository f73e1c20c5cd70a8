"""Reading what a person types: a line editor at a terminal, plain lines anywhere else.

`_Prompter` is what the chat loop and the approver ask. `_LineEditor` (chat at a terminal)
is prompt_toolkit, imported only when it is built: arrow keys and the usual shortcuts edit
the line instead of reaching the model as escape bytes, Up and Down recall messages from
earlier chats (a history file under the user's data directory), Esc then Enter (or Alt-Enter,
or Ctrl-J) starts a new line and a pasted block keeps its lines, Ctrl-C clears the line and
Ctrl-D on an empty line leaves. `_PlainPrompter` reads lines from a stream (a pipe, a file, a
test, or `run`'s approval question at a terminal).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console

#: What `chat --help` and ``/help`` say about editing.
EDITING_HELP = (
    "Enter sends; Esc then Enter (or Alt-Enter, Ctrl-J) starts a new line; Up and Down "
    "recall earlier messages; Ctrl-C cancels a running answer, keeping what it wrote, dimmed "
    "(at the prompt it clears the line); Ctrl-D or /exit leaves"
)


class _Prompter(Protocol):
    """Asks a person for a chat message or a short answer."""

    @property
    def interactive(self) -> bool:
        """Whether a person is there to answer (a terminal)."""
        ...

    async def message(self, prompt: str) -> str | None:
        """The next message; ``""`` when it was abandoned (Ctrl-C), None at the end (Ctrl-D)."""
        ...

    async def answer(self, question: str) -> str | None:
        """A one-line answer to `question`, or None when there is none."""
        ...


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _PlainPrompter:
    """Reads lines from a stream, printing each prompt on `console`."""

    def __init__(self, stream: IO[str], console: Console) -> None:
        # Here, not at module level: the parser imports this module (for ``--help``).
        from agent_flow.cli._interactive import _LineReader

        self._reader = _LineReader(stream)
        self._console = console
        self._interactive = _isatty(stream)

    @property
    def interactive(self) -> bool:
        """Whether the stream is a terminal."""
        return self._interactive

    async def message(self, prompt: str) -> str | None:
        """The next line, or None at the end of the input."""
        self._console.print(prompt, end="")
        return await self._reader.readline()

    async def answer(self, question: str) -> str | None:
        """The next line, or None at the end of the input."""
        return await self.message(question)


def chat_history_path() -> Path | None:
    """Where chat messages are remembered across chats: beside the default session store."""
    from agent_flow.sessions import default_store_path

    try:
        return default_store_path().parent / "chat_history"
    except RuntimeError:  # no home directory
        return None


class _LineEditor:
    """prompt_toolkit's line editor, with a history file shared by every chat.

    Args:
        history: The history file (None: remember messages for this chat only).
        input: prompt_toolkit's input (default: the terminal); tests give a pipe input.
        output: prompt_toolkit's output (default: the terminal).
    """

    def __init__(self, history: Path | None, *, input: Any = None, output: Any = None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, History, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

        remembered: History = InMemoryHistory()
        if history is not None:
            with contextlib.suppress(OSError):
                history.parent.mkdir(parents=True, exist_ok=True)
                history.touch(exist_ok=True)
                remembered = FileHistory(str(history))
        keys = KeyBindings()

        @keys.add("escape", "enter")
        @keys.add("c-j")
        def _newline(event: KeyPressEvent) -> None:
            event.current_buffer.insert_text("\n")

        self._messages: PromptSession[str] = PromptSession(
            history=remembered,
            key_bindings=keys,
            prompt_continuation=lambda width, line, soft: "." * (width - 1) + " ",
            input=input,
            output=output,
        )
        self._answers: PromptSession[str] = PromptSession(input=input, output=output)

    @property
    def interactive(self) -> bool:
        """A person is at the terminal."""
        return True

    async def message(self, prompt: str) -> str | None:
        """The next message; ``""`` after Ctrl-C, None after Ctrl-D on an empty line."""
        try:
            # handle_sigint=False: the chat's own SIGINT handler cancels running answers,
            # and prompt_toolkit would remove it when the prompt ends.
            return await self._messages.prompt_async(prompt, handle_sigint=False)
        except KeyboardInterrupt:
            return ""
        except EOFError:
            return None

    async def answer(self, question: str) -> str | None:
        """A one-line answer; None after Ctrl-C or Ctrl-D."""
        try:
            return await self._answers.prompt_async(question, handle_sigint=False)
        except (KeyboardInterrupt, EOFError):
            return None
