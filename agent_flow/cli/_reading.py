"""The reading and quiet modes of `run` and `chat`: the answer, not the trace.

`ReadingRenderer` (the default) folds a run's trace into one status line: on a terminal a
spinner line that follows the run (iteration, the tool running, the context's size) and
disappears; then the answer, rendered as Markdown on a terminal (plain text elsewhere), and
one dim line saying how the run went. What needs a person still gets its own line: approval
requests and answers, and each distinct warning once. An answer cut off by Ctrl-C is not lost:
the part already written is shown dimmed, marked as cut. ``--trace`` uses `EventRenderer`
instead, which prints every event.

`QuietRenderer` (``-q``) prints the answer alone on stdout, for scripts; approval requests go
to stderr.
"""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.markdown import Markdown
from rich.status import Status
from rich.text import Text

from agent_flow.cli.render import _short
from agent_flow.events import (
    AgentEvent,
    ApprovalRequired,
    ApprovalResolved,
    ContextBuilt,
    IterationStarted,
    ModelOutputDiscarded,
    ModelResponded,
    RunFinished,
    RunStarted,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    WarningRaised,
)

#: Stop reasons whose final text is the answer.
ANSWER_REASONS = frozenset({"completed", "answered", "converse"})


class ReadingRenderer:
    """Shows a run as one status line and its answer; use as an `EventBus` hook.

    Args:
        console: Where to print (see `agent_flow.cli.render.make_console`).
        markdown: Render answers as Markdown (default: on a terminal).
    """

    def __init__(self, console: Console, *, markdown: bool | None = None) -> None:
        self.console = console
        self.markdown = console.is_terminal if markdown is None else markdown
        self._status: Status | None = None
        self._warned: set[str] = set()
        self._calls = 0
        self._context = ""
        self._written = ""
        self._answer: list[str] = []  # the text of the model call in progress, whole

    # -- what _report and the approver use ---------------------------------------------

    def line(self, text: str | Text, style: str = "") -> None:
        """Print a whole line (the status line goes first)."""
        self.stop_spinner()
        self.console.print(Text(text, style=style) if isinstance(text, str) else text)

    def stop_spinner(self) -> None:
        """Take the status line away (before printing or prompting)."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _show(self, message: str) -> None:
        if not self.console.is_terminal:
            return
        # One line: a status that wraps would leave its first lines behind as it changes.
        width = max(self.console.width - 4, 10)
        message = message if len(message) <= width else message[: width - 1] + "…"
        if self._status is None:
            self._status = self.console.status(Text(message, style="dim"), spinner="dots")
            self._status.start()
        else:
            self._status.update(Text(message, style="dim"))

    # -- the hook ----------------------------------------------------------------------

    def __call__(self, event: AgentEvent) -> None:
        """Fold one event into the status line, or print what needs a person."""
        match event:
            case RunStarted():
                self._calls, self._context, self._written = 0, "", ""
                self._answer = []
                self._show("starting…")
            case IterationStarted():
                self._written = ""
                self._answer = []
            case ContextBuilt():
                breakdown = event.breakdown
                self._context = f"context {breakdown.total:,}/{breakdown.budget:,}"
                self._show(f"waiting for the model · {self._context}")
            case TextDelta():
                self._answer.append(event.text)
                self._written = (self._written + event.text)[-400:]
                tail = " ".join(self._written.split())[-60:]
                self._show(f"writing · …{tail}")
            case ModelOutputDiscarded():
                # A failed attempt's text is void: the retry writes the answer again.
                written = "".join(self._answer)
                if written.endswith(event.text):
                    written = written[: len(written) - len(event.text)]
                self._answer = [written] if written else []
                self._written = written[-400:]
            case ToolCallArgumentsDelta() if event.name is not None:
                self._show(f"calling {event.name}…")
            case ModelResponded():
                if event.source == "agent":
                    self._answer = []  # whole: a cancel from here on cuts no answer
                self._show(f"the model answered · {self._context}")
            case ToolCallStarted():
                self._calls += 1
                self._show(f"running {event.name} {_short(event.arguments, 80)}")
            case ToolCallCompleted():
                self._show(f"{event.name} done · {self._context}")
            case ApprovalRequired():
                room = self.console.width - len(event.name) - len(event.reason) - 7
                preview = _short(event.arguments, max(room, 10))
                self.line(f"? {event.name} {preview} ({event.reason})", "bold yellow")
            case ApprovalResolved():
                verdict = "approved" if event.approved else "refused"
                reason = f" ({event.reason})" if event.reason else ""
                colour = "green" if event.approved else "red"
                self.line(f"  {verdict}: {event.name}{reason}", colour)
            case WarningRaised() if event.source == "tokens":
                pass  # approximate counts for an unknown model: the trace says so
            case WarningRaised() if event.message not in self._warned:
                self._warned.add(event.message)
                self.line(f"warning: {event.message}", "yellow")
            case RunFinished():
                self._finished(event)
            case _:
                pass

    def _finished(self, event: RunFinished) -> None:
        self.stop_spinner()
        cut = "".join(self._answer).strip()
        if event.stop_reason == "cancelled" and cut:
            # What the model had written when the run was cancelled, shown as such.
            self.console.print(Text(cut, style="dim"))
            self.console.print(Text("[cut off here: the answer was cancelled]", style="yellow"))
        if event.stop_reason in ANSWER_REASONS and event.final_text:
            if self.markdown:
                self.console.print(Markdown(event.final_text))
            else:
                self.console.print(Text(event.final_text))
        if event.stop_reason == "error":
            return  # the command's error line says what went wrong, once
        tokens = event.prompt_tokens + event.completion_tokens
        calls = f"{self._calls} tool call{'' if self._calls == 1 else 's'}"
        iterations = f"{event.iterations} step{'' if event.iterations == 1 else 's'}"
        summary = (
            f"{event.stop_reason.replace('_', ' ')} · {iterations} · {calls} · "
            f"{tokens:,} tokens · {event.duration_ms / 1000:.1f} s"
        )
        self.line(summary, "dim")


class QuietRenderer:
    """Prints only the answer, on `stdout`; use as an `EventBus` hook (``-q``).

    Approval requests and their answers are shown on `console` (stderr), since a person may
    have to answer them; nothing else is printed.

    Args:
        stdout: Where the answer goes.
        console: Where approval requests go.
    """

    def __init__(self, stdout: IO[str], console: Console) -> None:
        self.stdout = stdout
        self.console = console

    def line(self, text: str | Text, style: str = "") -> None:
        """Notes are not printed in quiet mode."""

    def stop_spinner(self) -> None:
        """There is no spinner in quiet mode."""

    def __call__(self, event: AgentEvent) -> None:
        """Print the answer when the run ends, and approval requests as they come."""
        match event:
            case ApprovalRequired():
                self.console.print(
                    Text(f"? {event.name} {_short(event.arguments, 100)}: {event.reason}")
                )
            case RunFinished() if event.final_text and (
                event.stop_reason in ANSWER_REASONS or event.stop_reason == "waiting_for_user"
            ):
                self.stdout.write(event.final_text.rstrip("\n") + "\n")
                self.stdout.flush()
            case _:
                pass
