"""Summarizing: the one asynchronous step of pruning, folding old units into a `Summary`.

Pruning strategies (`agent_flow.history.pruning`) are synchronous functions over units.
Summarizing is not: a `Summarizer` may await a model (`agent_flow.llm.LLMSummarizer`) or not
(`ExtractiveSummarizer`), so it is a step of its own, with its own entry points:

- `SummarizeOldest` folds the oldest units into one summary when the units exceed a budget.
  It may run a sync strategy before it (a cheap one, so that the summarizer is asked only
  when that is not enough) and one after it (a last resort that makes the units fit).
  `History.fold` applies it to a history, and a `ContextManager` whose strategy is a
  `SummarizeOldest` awaits it in `prune_if_needed`;
- `History.summarize` replaces a chosen span of entries by a summary.

Both work on whole units, never fold the pinned first user message, and fold earlier summaries
into the new one rather than stacking summaries. A summary message never costs more than its
cap: text from the summarizer that runs over is cut with `truncate_to_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agent_flow._defaults import DEFAULT_SUMMARY_TOKENS
from agent_flow._text import truncate_to_tokens
from agent_flow.errors import UserError
from agent_flow.history.entries import HistoryEntry, Summary
from agent_flow.history.pruning import (
    PruneReport,
    PruneResult,
    PruningStrategy,
    _check_budget,
    _check_strategy,
    _merged_report,
    _total,
    _unchanged,
)
from agent_flow.history.units import Unit, _summary_message, build_units
from agent_flow.tokens import TokenCounter

__all__ = [
    "DEFAULT_SUMMARY_TOKENS",
    "SummarizeOldest",
    "Summarizer",
]


# A summary with less room than this for its text is not worth writing.
_MIN_SUMMARY_TEXT_TOKENS = 8

# The name of the summarizing step in reports.
_STEP_NAME = "summarize_oldest"


@runtime_checkable
class Summarizer(Protocol):
    """Writes the text of a summary of history entries."""

    async def summarize(self, entries: Sequence[HistoryEntry], *, max_tokens: int) -> str:
        """Return a summary of `entries` of at most `max_tokens` tokens."""
        ...


class SummarizeOldest:
    """Fold the oldest units into one `Summary` written by `summarizer`: an async pruning step.

    The folded span starts at the oldest unit and grows until the rest plus a summary of at
    most `max_summary_tokens` fits (or until only the last `keep_last_units` units are left).
    The pinned first user message is never folded; earlier summaries in the span are folded
    into the new one, so summaries do not pile up. The summary takes the place of the last
    folded unit. If no useful summary fits, or it would save nothing, nothing changes
    (``fits=False``); otherwise the result fits.

    It is not a `PruningStrategy` (the summarizer may await a model) and `Chain` refuses it:
    the strategies to run around it are given here, and each runs only while the units do not
    fit. ``SummarizeOldest(summarizer, before=ElideToolResults(), after=DropOldest())`` elides
    old tool results, then summarizes only if that was not enough, then drops the oldest units
    if still over: what the ``summarize`` strategy of `agent_flow.config.ContextConfig` does.

    Args:
        summarizer: Writes the summary text.
        keep_last_units: How many of the latest units are never folded.
        max_summary_tokens: The most prompt tokens the summary message may cost.
        before: A sync strategy applied first; the summarizer is not called when it is enough.
        after: A sync strategy applied last, when the units still do not fit.

    Raises:
        UserError: A count is out of range, or `before` or `after` is not a `PruningStrategy`.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        keep_last_units: int = 4,
        max_summary_tokens: int = DEFAULT_SUMMARY_TOKENS,
        before: PruningStrategy | None = None,
        after: PruningStrategy | None = None,
    ) -> None:
        if keep_last_units < 0:
            raise UserError(f"SummarizeOldest needs keep_last_units >= 0, got {keep_last_units}")
        if max_summary_tokens < 1:
            raise UserError(
                f"SummarizeOldest needs max_summary_tokens >= 1, got {max_summary_tokens}"
            )
        for strategy in (before, after):
            if strategy is not None:
                _check_strategy(strategy)
        self.summarizer = summarizer
        self.keep_last_units = keep_last_units
        self.max_summary_tokens = max_summary_tokens
        self.before = before
        self.after = after

    @property
    def name(self) -> str:
        """``summarize_oldest``, or ``chain(before, summarize_oldest, after)`` with the others."""
        if self.before is None and self.after is None:
            return _STEP_NAME
        names = [_STEP_NAME]
        if self.before is not None:
            names.insert(0, self.before.name)
        if self.after is not None:
            names.append(self.after.name)
        return f"chain({', '.join(names)})"

    async def fold(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Return the units shrunk towards `max_tokens`, and a report.

        Runs `before`, the summary, then `after`, each only while the units do not fit; the
        summarizer is the only thing awaited. With neither `before` nor `after`, the report is
        the summary step's own; otherwise it merges the steps like a `Chain`'s.

        Raises:
            UserError: `max_tokens` is negative.
            ModelError: The summarizer's model failed (from an LLM-backed summarizer).
        """
        _check_budget(max_tokens)
        if self.before is None and self.after is None:
            return await self._summarize(units, max_tokens, counter)
        tokens_before = _total(units)
        current = tuple(units)
        steps: list[PruneReport] = []
        if self.before is not None and _total(current) > max_tokens:
            result = self.before.prune(current, max_tokens, counter)
            current = result.units
            steps.append(result.report)
        if _total(current) > max_tokens:
            result = await self._summarize(current, max_tokens, counter)
            current = result.units
            steps.append(result.report)
        if self.after is not None and _total(current) > max_tokens:
            result = self.after.prune(current, max_tokens, counter)
            current = result.units
            steps.append(result.report)
        return PruneResult(
            current, _merged_report(self.name, tokens_before, current, max_tokens, steps)
        )

    def _plan(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> tuple[list[int], int] | None:
        """Return the indices of the units to fold and the summary's cap, or None if no use."""
        kept = _total(units)
        foldable = [
            i
            for i in range(max(0, len(units) - self.keep_last_units))
            if not (units[i].pinned and units[i].kind == "user")
        ]
        fold: list[int] = []
        for index in foldable:
            fold.append(index)
            kept -= units[index].tokens
            if kept + self.max_summary_tokens <= max_tokens:
                break
        cap = min(self.max_summary_tokens, max_tokens - kept)
        header = counter.count_message(_summary_message(""))
        if not fold or cap - header < _MIN_SUMMARY_TEXT_TOKENS:
            return None
        return fold, cap

    async def _summarize(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Summarize as few of the oldest units as make the rest fit with the summary."""
        before = _total(units)
        if before <= max_tokens:
            return _unchanged(_STEP_NAME, units, max_tokens)
        plan = self._plan(units, max_tokens, counter)
        if plan is None:
            return _unchanged(_STEP_NAME, units, max_tokens)
        fold, cap = plan
        folded = await _fold_units(units, fold, self.summarizer, cap, counter)
        if folded is None:
            return _unchanged(_STEP_NAME, units, max_tokens)
        new_units, summary = folded
        after = _total(new_units)
        if after >= before:
            return _unchanged(_STEP_NAME, units, max_tokens)
        report = PruneReport(
            strategy=_STEP_NAME,
            tokens_before=before,
            tokens_after=after,
            max_tokens=max_tokens,
            summarized=summary.replaced_ids,
            summary_id=summary.id,
            fits=after <= max_tokens,
        )
        return PruneResult(tuple(new_units), report)

    def __repr__(self) -> str:
        around = "".join(
            f", {label}={strategy!r}"
            for label, strategy in (("before", self.before), ("after", self.after))
            if strategy is not None
        )
        return (
            f"SummarizeOldest({self.summarizer!r}, keep_last_units={self.keep_last_units}, "
            f"max_summary_tokens={self.max_summary_tokens}{around})"
        )


# -- folding, shared by SummarizeOldest and History.summarize -----------------------------


def _span_to_fold(units: Sequence[Unit], entry_count: int, start: int, end: int) -> list[int]:
    """Return the indices of the units `History.summarize(start, end)` folds.

    The entry span is widened to whole units; the pinned first user message is left out.

    Raises:
        UserError: The indices are out of range or empty, the span holds only the pinned
            first user message, or it includes calls still waiting for their results.
    """
    if not 0 <= start < end <= entry_count:
        raise UserError(
            f"summarize needs 0 <= start < end <= {entry_count}, got start={start} end={end}"
        )
    first_unit = last_unit = -1
    offset = 0
    for index, unit in enumerate(units):
        following = offset + len(unit.entries)
        if first_unit < 0 and start < following:
            first_unit = index
        if end <= following:
            last_unit = index
            break
        offset = following
    fold = [
        i
        for i in range(first_unit, last_unit + 1)
        if not (units[i].pinned and units[i].kind == "user")
    ]
    if not fold:
        raise UserError(
            f"entries {start}..{end} hold only the pinned first user message, which is never "
            "summarized; choose a span with other entries"
        )
    if fold[-1] == len(units) - 1 and units[-1].pending:
        raise UserError(
            f"entries {start}..{end} include calls still waiting for their results "
            f"({', '.join(c.call_id for c in units[-1].pending)}); add the results "
            "first or end the span before that turn"
        )
    return fold


async def _fold_units(
    units: Sequence[Unit],
    fold: Sequence[int],
    summarizer: Summarizer,
    max_message_tokens: int,
    counter: TokenCounter,
) -> tuple[list[Unit], Summary] | None:
    """Summarize the units at indices `fold` (ascending) into one `Summary` unit.

    The summary message costs at most `max_message_tokens` and takes the place of the last
    folded unit; the other units keep their order. Returns None when the summary header alone
    would not fit.
    """
    header = counter.count_message(_summary_message(""))
    if max_message_tokens - header <= 0:
        return None
    entries = [e for i in fold for e in units[i].entries]
    text = await summarizer.summarize(entries, max_tokens=max_message_tokens - header)

    def cost(content: str) -> int:
        return counter.count_message(_summary_message(content))

    content, _ = truncate_to_tokens(text, max_message_tokens, cost)
    summary = Summary(content=content, replaced_ids=tuple(e.id for e in entries))
    (summary_unit,) = build_units([summary], counter)
    folded = set(fold)
    result: list[Unit] = []
    for index, unit in enumerate(units):
        if index == fold[-1]:
            result.append(summary_unit)
        elif index not in folded:
            result.append(unit)
    return result, summary
