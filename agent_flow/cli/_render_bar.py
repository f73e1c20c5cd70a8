"""The trace view's one-line summaries of a prompt's budget and of a history pruning.

`budget_bar` draws where a prompt's tokens went, section by section, against its budget;
`prune_summary` says what a pruning did. `agent_flow.cli.render.EventRenderer` prints them.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text

from agent_flow.history import PruneReport
from agent_flow.prompt import PromptBreakdown

__all__ = ["BAR_WIDTH", "budget_bar", "prune_summary"]

#: Cells of the bar.
BAR_WIDTH = 30

# The sections: (label, field of PromptBreakdown, colour, letter used without colour).
_SECTIONS = (
    ("system", "system_template", "magenta", "s"),
    ("environment", "environment", "green", "e"),
    ("tools", "tools", "blue", "t"),
    ("history", "history", "cyan", "h"),
)


def budget_bar(breakdown: PromptBreakdown, *, color: bool, glyph: Callable[[str], str]) -> Text:
    """The token-budget bar of one prompt, with its per-section split.

    Args:
        breakdown: Where the prompt's tokens went.
        color: Draw the sections in colour (else each with its letter).
        glyph: The console's glyph for a name (``"block"``, ``"free"``).
    """
    budget = max(breakdown.budget, 1)
    parts = [
        (label, getattr(breakdown, field), colour, letter)
        for label, field, colour, letter in _SECTIONS
    ]
    # The reserve is drawn at the right end; the sections fill from the left, never
    # into it (rounding cannot push the bar past its width).
    reserve = min(round(breakdown.reserve * BAR_WIDTH / budget), BAR_WIDTH)
    room = BAR_WIDTH - reserve
    bar = Text("  context ")
    bar.append("[")
    cells: list[tuple[int, str, str]] = []
    for _label, tokens, colour, letter in parts:
        count = min(round(tokens * BAR_WIDTH / budget), room)
        room -= count
        cells.append((count, colour, letter))
    free = room
    for count, colour, letter in cells:
        if color:
            bar.append(glyph("block") * count, style=colour)
        else:
            bar.append(letter * count)
    bar.append(glyph("free") * free, style="dim")
    bar.append(("r" if not color else glyph("block")) * reserve, style="grey37")
    bar.append("] ")
    bar.append(f"{breakdown.total:,}/{breakdown.budget:,} tokens: ")
    dot = glyph("free")
    for number, (label, tokens, colour, _) in enumerate(parts):
        bar.append(f"{' ' + dot + ' ' if number else ''}{label} {tokens:,}", style=colour)
    bar.append(f" {dot} reserve {breakdown.reserve:,}", style="dim")
    notes = []
    if breakdown.history_units_omitted:
        notes.append(f"{breakdown.history_units_omitted} history unit(s) left out")
    if breakdown.environment_degraded:
        notes.append("environment shortened to fit")
    if notes:
        bar.append(f" ({'; '.join(notes)})", style="yellow")
    return bar


def prune_summary(report: PruneReport) -> str:
    """One line saying what a pruning did."""
    what = []
    for label, ids in (
        ("dropped {} entries", report.dropped),
        ("elided {} tool result(s)", report.elided),
        ("summarized {} entries", report.summarized),
    ):
        if ids:
            what.append(label.format(len(ids)))
    done = ", ".join(what) or "no change"
    return (
        f"history pruned by {report.strategy}: {report.tokens_before:,} -> "
        f"{report.tokens_after:,} tokens (budget {report.max_tokens:,}); {done}"
    )
