"""Terminal rendering of the event stream for the `agent-flow` command (and the demo).

`EventRenderer` is called with each event as it is published (it is an `EventBus` hook, so
it runs in order with the run, before an approval prompt asks anything) and prints:
streamed text and thinking inline, tool calls as their arguments stream in, tool results,
environment changes, pruning notices, plan updates, approvals, warnings and errors, and a
token-budget bar with the per-section split of every prompt. On a terminal a spinner shows
while the model is being waited on, long lines (streamed text too) wrap at word boundaries
to the terminal's width, and argument and result previews are cut to fit one line of it;
elsewhere (a pipe, a file, a test) output is plain, uncoloured and never wrapped, so it reads
the same every time. A delegated child's events (their `path`) are drawn as a tree under the
parent's tool call, each of its lines indented and led by its run id (`_render_tree`).

`JsonLinesWriter` is the ``--json`` alternative: one `event_to_json` line per event.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter

from rich.cells import cell_len
from rich.console import Console
from rich.status import Status
from rich.text import Text

from agent_flow._types import JsonValue
from agent_flow.cli._console import make_console
from agent_flow.cli._json_lines import JsonLinesWriter
from agent_flow.cli._render_bar import budget_bar, prune_summary
from agent_flow.cli._render_tree import Speaker, delegated_finished, delegated_started, whole_lines
from agent_flow.environment import EnvironmentChange
from agent_flow.events import (
    AgentEvent,
    ApprovalRequired,
    ApprovalResolved,
    ContextBuilt,
    EnvironmentUpdated,
    EventsDropped,
    ExecutionError,
    HistoryPruned,
    IterationStarted,
    MCPListChanged,
    ModelOutputDiscarded,
    ModelResponded,
    ModelRetrying,
    PlanUpdated,
    RunFinished,
    RunStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    WarningRaised,
)
from agent_flow.history import PruneReport
from agent_flow.prompt import PromptBreakdown

__all__ = ["EventRenderer", "JsonLinesWriter", "format_cost", "make_console"]

_SHOWN_CHANGES = 6
_THINKING = Text("  thinking: ", style="dim")

# Glyphs with an ASCII fallback for consoles that cannot encode them.
_GLYPHS = {
    "run": ("▶", ">"),
    "end": ("■", "#"),
    "call": ("▸", ">"),
    "tool": ("⚙", "*"),
    "ok": ("✓", "+"),
    "fail": ("✗", "x"),
    "env": ("◆", "*"),
    "prune": ("✂", "%"),
    "plan": ("☰", "="),
    "ask": ("?", "?"),
    "warn": ("⚠", "!"),
    "model": ("·", "-"),
    "gap": ("…", "..."),
    "rule": ("─", "-"),
    "block": ("█", "#"),
    "free": ("·", "."),
    "child": ("↳", "->"),
    "bar": ("│", "|"),
}


def _short(text: str, limit: int) -> str:
    """`text` on one line of at most `limit` characters.

    JSON is shown compact; several lines show as the first and the last (a command's exit
    code and its verdict, say).
    """
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            stripped = json.dumps(json.loads(stripped), ensure_ascii=False, separators=(",", ":"))
    lines = [line.strip() for line in stripped.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    if len(line) > limit:
        return line[: limit - 1] + "…"
    return line


def _value(value: JsonValue | None, limit: int = 60) -> str:
    """A compact description of a JSON value for a change line."""
    if isinstance(value, dict):
        return f"{{{len(value)} entries}}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_cost(cost_usd: float | None) -> str:
    """A cost for the terminal: ``$0.0123``; ``cost unknown`` when it is (never ``$0``)."""
    if cost_usd is None:
        return "cost unknown"
    if cost_usd == 0 or cost_usd >= 0.01:
        return f"${cost_usd:,.2f}"
    return f"${cost_usd:.6f}".rstrip("0")


class EventRenderer:
    """Prints each event of a run as it happens; use as an `EventBus` hook.

    Args:
        console: Where to print (see `make_console`).
        spinner: Show a spinner while waiting on the model (only on a terminal).
        show_thinking: Print the model's streamed reasoning.
        max_arguments: Characters of a tool call's arguments shown while they stream
            (default: what fits the rest of a terminal line; 160 elsewhere).
        max_result: Characters of a tool result shown (default as for `max_arguments`).
        fatal_detail: Print a fatal error's message; off where the caller reports it once
            itself (the command's error line).
    """

    def __init__(
        self,
        console: Console,
        *,
        spinner: bool = True,
        show_thinking: bool = True,
        max_arguments: int | None = None,
        max_result: int | None = None,
        fatal_detail: bool = True,
    ) -> None:
        self.console = console
        self.spinner = spinner and console.is_terminal
        self.show_thinking = show_thinking
        self._max_arguments = max_arguments
        self._max_result = max_result
        self.fatal_detail = fatal_detail
        # On a terminal streamed text is wrapped here, word by word: rich wraps whole lines
        # only, and does not know where a line it did not print ends.
        self._wrap = console.is_terminal and not console.soft_wrap
        self._column = 0
        self._indent = 0
        self._partial = ""
        #: How many events of each kind were rendered.
        self.counts: Counter[str] = Counter()
        encoding = (getattr(console.file, "encoding", None) or "utf-8").lower()
        self._ascii = not encoding.replace("-", "").startswith("utf")
        self._color = console.color_system is not None
        self._open: str | None = None  # "text", "thinking" or "args:<index>" while a line is open
        self._arguments_shown: dict[str, int] = {}
        self._streamed_calls: set[tuple[str, str]] = set()
        self._streamed_text = False
        self._status: Status | None = None
        # Whose event is being drawn: a delegated child's lines are indented and led by its
        # short run id (`_render_tree`); None for the top-level run.
        self._speaker: Speaker | None = None
        self._held: dict[str, str] = {}  # a child's streamed line until it ends (by key)
        self._children: dict[str, Speaker] = {}  # children started and not finished

    # -- helpers ---------------------------------------------------------------------------

    def _g(self, name: str) -> str:
        glyph, fallback = _GLYPHS[name]
        return fallback if self._ascii else glyph

    def _room(self, used: int, limit: int | None) -> int:
        """Characters a preview may take: `limit`, else the rest of a terminal line."""
        if limit is not None:
            return limit
        if not self.console.is_terminal:
            return 160
        return max(10, self.console.width - used - len(self._lead()) - 1)

    @property
    def max_arguments(self) -> int:
        """Characters of a tool call's arguments shown on one line."""
        return self._room(24, self._max_arguments)

    @property
    def max_result(self) -> int:
        """Characters of a tool result shown on one line."""
        return self._room(32, self._max_result)

    def _lead(self) -> str:
        """What starts a line of the run being drawn: nothing for the top level."""
        return "" if self._speaker is None else self._speaker.lead(self._g("bar"))

    def _key(self, kind: str) -> str:
        """The name of the open streamed line of `kind` of the run being drawn."""
        return kind if self._speaker is None else self._speaker.key(kind)

    def _close_line(self) -> None:
        self._flush_partial()
        if self._open is not None:
            self.console.print()
            self._open = None
        self._column = 0

    def _write(self, text: str, style: str = "") -> None:
        """Continue the open line with `text`, wrapping at word boundaries on a terminal."""
        if not self._wrap:
            self.console.print(Text(text, style=style), end="")
            return
        # A word may arrive in pieces: hold its start until it ends, then place it.
        pieces = re.split(r"(\s+)", self._partial + text)
        self._partial = pieces.pop() if pieces and pieces[-1] and not text[-1:].isspace() else ""
        for piece in pieces:
            self._place(piece, style)

    def _flush_partial(self) -> None:
        if self._partial:
            partial, self._partial = self._partial, ""
            self._place(partial, "")

    def _place(self, piece: str, style: str) -> None:
        if not piece:
            return
        width = self.console.width
        if piece.isspace():
            if "\n" in piece:
                self.console.print(end="\n" * piece.count("\n") + " " * self._indent)
                self._column = self._indent
            elif self._column + len(piece) < width and self._column > self._indent:
                self.console.print(Text(piece), end="", soft_wrap=True)
                self._column += len(piece)
            return
        size = cell_len(piece)
        if self._column + size > width and self._column > self._indent:
            self.console.print(end="\n" + " " * self._indent)
            self._column = self._indent
        self.console.print(Text(piece, style=style), end="", soft_wrap=True)
        self._column += size

    def _safe(self, text: str) -> str:
        """`text` as the console can encode it (non-ASCII becomes '?' on an ASCII console)."""
        if not self._ascii:
            return text
        return text.encode("ascii", "replace").decode("ascii")

    def line(self, text: str | Text, style: str = "") -> None:
        """Print a whole line, ending any streamed line first."""
        self.stop_spinner()
        self._close_line()
        if isinstance(text, str):
            text = Text(self._safe(text), style=style)
        if self._speaker is None:
            self.console.print(text)
        else:
            self._print_led(self._lead(), text)

    def _tree_line(self, speaker: Speaker, text: str) -> None:
        """A child's start or end: at its depth, without its lead."""
        self.stop_spinner()
        self._close_line()
        self._print_led(speaker.indent, Text(self._safe(text), style="bold"))

    def _print_led(self, lead: str, text: Text) -> None:
        """`text` after `lead`; on a terminal its wrapped lines hang under it (the tree shows)."""
        head = Text(self._safe(lead), style="dim")
        if not self._wrap:
            self.console.print(Text.assemble(head, text))
            return
        room = max(10, self.console.width - head.cell_len)
        for number, part in enumerate(text.wrap(self.console, room)):
            self.console.print(Text.assemble(head if number == 0 else " " * head.cell_len, part))

    def stop_spinner(self) -> None:
        """Stop the spinner (before printing or prompting)."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _start_spinner(self, message: str) -> None:
        if self.spinner and self._status is None:
            self._status = self.console.status(message, spinner="dots")
            self._status.start()

    def _inline(self, kind: str, text: str, style: str = "", prefix: Text | None = None) -> None:
        self.stop_spinner()
        key = self._key(kind)
        if self._open != key:
            self._close_line()
            lead = Text(self._safe(self._lead()), style="dim")
            if prefix is not None:
                lead.append_text(prefix)
            if lead:
                self.console.print(lead, end="", soft_wrap=True)
            self._column = self._indent = lead.cell_len
            self._open = key
        self._write(self._safe(text), style)

    def _stream(self, kind: str, text: str, style: str = "", prefix: Text | None = None) -> None:
        """Streamed text; a child's is shown by whole lines, each led by its run id."""
        if self._speaker is None:
            self._inline(kind, text, style, prefix)
            return
        key = self._key(kind)
        lines, self._held[key] = whole_lines(self._held.pop(key, ""), text)
        for line in lines:
            self._child_text(line, style, prefix)

    def _child_text(self, text: str, style: str, prefix: Text | None, end: str = "") -> None:
        shown = Text.assemble(prefix or "", Text(self._safe(text), style=style), end)
        if shown.plain:
            self.line(shown)
        else:  # a blank line of the child's text: its lead alone
            self.stop_spinner()
            self._close_line()
            self.console.print(Text(self._safe(self._lead().rstrip()), style="dim"))

    def _release(self, keep: str | None = None, end: str = "") -> None:
        """Show the child's held text (but its `keep` kind's): the child went on to other things."""
        for kind, style, prefix in (("text", "", None), ("thinking", "dim italic", _THINKING)):
            held = self._held.pop(self._key(kind), "") if kind != keep else ""
            if held:
                self._child_text(held, style, prefix, end)

    # -- the hook ----------------------------------------------------------------------------

    def __call__(self, event: AgentEvent) -> None:
        """Render one event."""
        self.counts[event.kind] += 1
        self._speaker = Speaker.of(event)
        try:
            if self._speaker is not None and not isinstance(event, RunFinished):
                # A child's streamed line ends where its text stops.
                kind = {"text_delta": "text", "thinking_delta": "thinking"}.get(event.kind)
                self._release(keep=kind)
            self._render(event)
        finally:
            self._speaker = None

    def _render(self, event: AgentEvent) -> None:
        match event:
            case RunStarted() if self._speaker is not None:
                # The start and end of a child are drawn at its depth, without its lead.
                self._children[event.run_id] = self._speaker
                task = _short(event.task, 160)
                self._tree_line(self._speaker, delegated_started(event, self._g("child"), task))
            case RunStarted():
                self._streamed_text = False
                self.line(
                    f"{self._g('run')} run {event.run_id[:8]} started · agent {event.agent} · "
                    f"model {event.model}",
                    "bold",
                )
                self.line(f"  task: {_short(event.task, 200)}")
            case IterationStarted():
                rule = self._g("rule") * 2
                self.line(f"{rule} iteration {event.iteration} {rule}", "dim")
            case ContextBuilt():
                self.line(self.budget_bar(event.breakdown))
                self._start_spinner("waiting for the model...")
            case ThinkingDelta():
                if self.show_thinking:
                    self._stream(
                        "thinking",
                        event.text,
                        "dim italic",
                        _THINKING,
                    )
            case TextDelta():
                self._streamed_text |= self._speaker is None
                self._stream("text", event.text)
            case ToolCallArgumentsDelta():
                self._arguments_delta(event)
            case ModelResponded():
                self.line(
                    f"  {self._g('model')} "
                    f"{'summarizer' if event.source == 'summarizer' else 'model'} answered in "
                    f"{event.duration_ms:,.0f} ms: "
                    f"{event.prompt_tokens:,} prompt + {event.completion_tokens:,} completion "
                    f"tokens ({format_cost(event.cost_usd)}), {event.tool_calls} tool call(s), "
                    f"finish {event.finish_reason}",
                    "dim",
                )
            case ToolCallStarted():
                used = 14 + len(event.name)
                shown = (
                    ""
                    if (event.run_id, event.call_id) in self._streamed_calls
                    else " " + _short(event.arguments, self._room(used, self._max_arguments))
                )
                self.line(f"  {self._g('tool')} running {event.name}{shown}", "cyan")
            case ToolCallCompleted():
                self._completed(event)
            case ToolCallFailed():
                self.line(
                    f"  {self._g('fail')} {event.name} failed: {_short(event.error, 200)}", "red"
                )
            case EnvironmentUpdated():
                self._environment(event.source, event.version, event.changes)
            case HistoryPruned():
                self.line(f"  {self._g('prune')} {self.prune_summary(event.report)}", "magenta")
            case MCPListChanged():
                added = f" +{', +'.join(event.added)}" if event.added else ""
                removed = f" -{', -'.join(event.removed)}" if event.removed else ""
                self.line(
                    f"  {self._g('tool')} MCP server {event.server} changed its "
                    f"{event.component}:{added}{removed}",
                    "dim",
                )
            case PlanUpdated():
                self.line(f"  {self._g('plan')} plan updated:", "blue")
                for step in event.plan:
                    mark = "[x]" if step.completed else "[ ]"
                    current = "  <- current" if step.description == event.current_step else ""
                    self.line(f"      {mark} {step.description}{current}", "blue")
            case ApprovalRequired():
                used = 24 + len(event.name) + len(event.reason)
                preview = _short(event.arguments, self._room(used, 100 if self._wrap else None))
                self.line(
                    f"  {self._g('ask')} approval needed for {event.name} {preview}: "
                    f"{event.reason}",
                    "bold yellow",
                )
            case ApprovalResolved():
                verdict = "approved" if event.approved else "refused"
                glyph = self._g("ok") if event.approved else self._g("fail")
                reason = f" ({event.reason})" if event.reason else ""
                self.line(
                    f"  {glyph} {verdict}: {event.name}{reason}",
                    "green" if event.approved else "red",
                )
            case ModelRetrying():
                self.line(
                    f"  {self._g('warn')} model call failed (attempt {event.attempt} of "
                    f"{event.max_attempts}), retrying in {event.delay:.1f} s: {event.reason}",
                    "yellow",
                )
            case ModelOutputDiscarded():
                self.line(
                    f"  {self._g('warn')} the {len(event.text)} characters above from the failed "
                    "attempt are discarded",
                    "yellow",
                )
            case WarningRaised():
                source = f" ({event.source})" if event.source else ""
                self.line(f"  {self._g('warn')} warning{source}: {event.message}", "yellow")
            case ExecutionError():
                what = "fatal" if event.fatal else "the run goes on"
                # The command's error line states the top-level run's fatal error, not a child's.
                detail = self.fatal_detail or not event.fatal or self._speaker is not None
                message = f": {event.message}" if detail else ""
                self.line(
                    f"  {self._g('fail')} error {event.error_type}{message} [{what}]",
                    "bold red" if event.fatal else "red",
                )
            case RunFinished():
                self._finished(event)
            case EventsDropped():
                self.line(
                    f"  {self._g('gap')} {event.count} event(s) dropped for this subscriber "
                    f"(seq {event.first_seq}-{event.last_seq}): it fell behind",
                    "yellow",
                )

    # -- the pieces --------------------------------------------------------------------------

    def _arguments_delta(self, event: ToolCallArgumentsDelta) -> None:
        key = self._key(f"args:{event.index}")
        if event.call_id is not None:
            self._streamed_calls.add((event.run_id, event.call_id))
        if event.name is not None or self._open != key:
            if event.name is not None:
                self._arguments_shown[key] = 0
            label = event.name or f"call #{event.index}"
            self.stop_spinner()
            self._close_line()
            prefix = Text(self._safe(self._lead()), style="dim")
            prefix.append(self._safe(f"  {self._g('call')} {label} "), style="cyan")
            self.console.print(prefix, end="", soft_wrap=True)
            self._column = prefix.cell_len
            self._open = key
        shown = self._arguments_shown.get(key, 0)
        # `_room` leaves out the lead; the rest of the line's start is the call's label.
        limit = self._room(self._column - shown - len(self._lead()), self._max_arguments)
        if shown >= limit:
            return
        piece = event.delta.replace("\n", " ")
        room = limit - shown
        if len(piece) > room:
            piece = piece[:room] + "…"
        self._arguments_shown[key] = shown + len(piece)
        self.console.print(Text(self._safe(piece), style="dim"), end="", soft_wrap=True)
        self._column += len(piece)

    def _completed(self, event: ToolCallCompleted) -> None:
        extra = " [truncated for the model]" if event.truncated else ""
        used = 20 + len(event.name) + len(extra)
        summary = _short(event.content, self._room(used, self._max_result))
        if event.is_error:
            self.line(
                f"  {self._g('fail')} {event.name} reported an error: {summary}{extra}", "yellow"
            )
        else:
            self.line(
                f"  {self._g('ok')} {event.name} ({event.duration_ms:,.0f} ms): {summary}{extra}",
                "green",
            )

    def _environment(
        self, source: str, version: int, changes: tuple[EnvironmentChange, ...]
    ) -> None:
        self.line(
            f"  {self._g('env')} environment v{version} from {source}: {len(changes)} change(s)",
            "green",
        )
        for change in changes[:_SHOWN_CHANGES]:
            if change.op == "delete":
                self.line(f"      delete {change.pointer}", "dim")
            else:
                self.line(f"      set {change.pointer} = {_value(change.new)}", "dim")
        if len(changes) > _SHOWN_CHANGES:
            self.line(f"      (+{len(changes) - _SHOWN_CHANGES} more)", "dim")

    def _finished(self, event: RunFinished) -> None:
        cut = f" {self._g('prune')} cut off" if event.stop_reason == "cancelled" else ""
        if cut and self._open == self._key("text"):
            # The streamed answer above stops here: say so on its own line.
            self.stop_spinner()
            self._write(cut, "yellow")
        if self._speaker is not None:
            self._release(end=cut)
            # A child's end is one line in the parent's trace (its answer is the parent's
            # tool result), drawn at the child's depth like its start.
            self._children.pop(event.run_id, None)
            cost = format_cost(event.cost_usd)
            self._tree_line(self._speaker, delegated_finished(event, self._g("end"), cost))
            return
        # A child that never said it finished (its run ended with ours): show what it held.
        for speaker in list(self._children.values()):
            self._speaker = speaker
            self._release(end=cut)
        self._speaker = None
        self._children.clear()
        self.line(
            f"{self._g('end')} run finished: {event.stop_reason} after {event.iterations} "
            f"iteration(s) · {event.prompt_tokens:,} prompt + {event.completion_tokens:,} "
            f"completion tokens · {format_cost(event.cost_usd)} · "
            f"{event.duration_ms / 1000:.1f} s",
            "bold",
        )
        # An answer streamed as text was shown already; a fatal error has its own line.
        shown = event.stop_reason == "answered" and self._streamed_text
        if event.final_text and not shown and event.stop_reason != "error":
            self.line(f"  {event.final_text}")

    def budget_bar(self, breakdown: PromptBreakdown) -> Text:
        """The token-budget bar of one prompt, with its per-section split."""
        return budget_bar(breakdown, color=self._color, glyph=self._g)

    @staticmethod
    def prune_summary(report: PruneReport) -> str:
        """One line saying what a pruning did."""
        return prune_summary(report)
