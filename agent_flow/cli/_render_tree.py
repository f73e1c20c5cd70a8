"""The trace view's tree: where a delegated child's events go in `EventRenderer`'s output.

A child's events reach the parent's bus with ``event.path`` naming the runs above it
(`agent_flow.delegation`). The trace draws them as a tree under the parent's tool call: each
line of a child is indented one level (`LEVEL` spaces) per element of its path and starts
with the child's short run id, so the lines of children that run in parallel can be told
apart::

      ⚙ running investigate {"task":"look"}
        ↳ delegated run 5f2c9a1b started · task: look
        5f2c9a1b │ ── iteration 1 ──
        5f2c9a1b │ The answer is 42.
        ■ delegated run 5f2c9a1b finished: answered after 1 iteration(s) · 10 prompt + ...
      ✓ investigate (14 ms): The answer is 42.

A child's streamed text is shown by whole lines (`whole_lines`), each on a line of its own:
never glued to the parent's open line nor to a sibling's. `Speaker` is whose line is being
drawn (``None`` for the top-level run); this module formats a child's own lines, the renderer
prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_flow.events import AgentEvent, RunFinished, RunStarted

__all__ = ["LEVEL", "Speaker", "delegated_finished", "delegated_started", "whole_lines"]

#: Spaces of indentation per level of delegation.
LEVEL = 4

SHORT_ID = 8


@dataclass(frozen=True)
class Speaker:
    """A delegated child run whose events are being drawn.

    Attributes:
        run_id: The child's run id.
        depth: How many runs it was delegated from (``len(event.path)``, at least 1).
    """

    run_id: str
    depth: int

    @classmethod
    def of(cls, event: AgentEvent) -> Speaker | None:
        """The child run `event` belongs to; ``None`` for a top-level run's event."""
        return cls(event.run_id, len(event.path)) if event.path else None

    @property
    def indent(self) -> str:
        """The spaces before each of its lines."""
        return " " * (LEVEL * self.depth)

    def lead(self, bar: str) -> str:
        """What starts each of its lines but the start and the end: indent, short id, `bar`."""
        return f"{self.indent}{self.run_id[:SHORT_ID]} {bar} "

    def key(self, kind: str) -> str:
        """The name of its open streamed line of `kind` (text, thinking, a call's arguments)."""
        return f"{kind}@{self.run_id}"


def delegated_started(event: RunStarted, arrow: str, task: str) -> str:
    """The line a child's start is shown as (after its indent): its sub-task, `task`."""
    return f"{arrow} delegated run {event.run_id[:SHORT_ID]} started · task: {task}"


def delegated_finished(event: RunFinished, end: str, cost: str) -> str:
    """A child's end on one line (after its indent): stop reason, tokens, `cost`, duration.

    Its answer is not repeated: it streamed above, and the parent's tool result shows it.
    """
    return (
        f"{end} delegated run {event.run_id[:SHORT_ID]} finished: "
        f"{event.stop_reason} after {event.iterations} iteration(s) · "
        f"{event.prompt_tokens:,} prompt + {event.completion_tokens:,} completion tokens · "
        f"{cost} · {event.duration_ms / 1000:.1f} s"
    )


def whole_lines(held: str, text: str) -> tuple[list[str], str]:
    """The lines a child's streamed `text` completes after the `held` start of one.

    A child's text is shown by whole lines: children run in parallel, and words of two
    answers taking turns on one terminal would be unreadable.

    Returns:
        The complete lines, and the start of the next one (to hold until it ends).
    """
    *lines, rest = (held + text).split("\n")
    return lines, rest
