"""Pruning strategies that shrink a history to a token budget, and summarizers.

A `PruningStrategy` takes the units of a history (see `agent_flow.history`), a budget and a
counter, and returns the units to keep with a `PruneReport` of what it did. Every built-in
strategy:

- changes nothing when the units already fit (``sum(u.tokens) <= max_tokens``);
- works on whole units (a call is never separated from its result) and keeps their order;
- never drops a pinned unit (the first user message, summaries; `SummarizeOldest` folds
  earlier summaries into the one it writes rather than stacking them);
- when the budget cannot be reached, returns its best effort with ``fits=False``.

The strategies: `DropOldest` drops the oldest units; `SlidingWindow` keeps the last turns;
`ElideToolResults` replaces old tool-result bodies by a short marker; `SummarizeOldest` folds
the oldest units into one `Summary` written by a `Summarizer`; `Chain` applies strategies in
order until the budget holds. `ExtractiveSummarizer` writes summaries without a model.

Budgets compare with `History.token_count()`: the history's messages without reply priming.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from agent_flow.errors import UserError
from agent_flow.history import (
    SUMMARY_PREFIX,
    AgentMessage,
    AgentThinking,
    HistoryEntry,
    Summary,
    ToolCall,
    ToolResult,
    Unit,
    UserMessage,
    _fold_units,
    _replace_results,
    _summary_message,
    _tool_message,
    truncate_to_tokens,
)
from agent_flow.tokens import TokenCounter, default_counter

__all__ = [
    "Chain",
    "DropOldest",
    "ElideToolResults",
    "ExtractiveSummarizer",
    "PruneReport",
    "PruneResult",
    "PruningStrategy",
    "SlidingWindow",
    "SummarizeOldest",
    "Summarizer",
    "elision_marker",
]


class PruneReport(BaseModel):
    """What one pruning did.

    Attributes:
        strategy: The strategy's name.
        tokens_before: The units' tokens before.
        tokens_after: The units' tokens after.
        max_tokens: The budget.
        dropped: Ids of the entries removed.
        elided: Ids of the tool results whose bodies were replaced by a marker.
        summarized: Ids of the entries folded into a summary.
        summary_id: The id of the summary made, if any (the last one, for a chain).
        fits: Whether ``tokens_after <= max_tokens``.
        steps: For a `Chain`, the report of each strategy it applied, in order.
    """

    model_config = ConfigDict(frozen=True)

    strategy: str
    tokens_before: int
    tokens_after: int
    max_tokens: int
    dropped: tuple[str, ...] = ()
    elided: tuple[str, ...] = ()
    summarized: tuple[str, ...] = ()
    summary_id: str | None = None
    fits: bool
    steps: tuple[PruneReport, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether anything was dropped, elided or summarized."""
        return bool(self.dropped or self.elided or self.summarized)


@dataclass(frozen=True, slots=True)
class PruneResult:
    """The units a strategy keeps (unchanged ones are the very input objects) and its report."""

    units: tuple[Unit, ...]
    report: PruneReport

    @property
    def entries(self) -> tuple[HistoryEntry, ...]:
        """The kept entries, in order."""
        return tuple(e for u in self.units for e in u.entries)


@runtime_checkable
class PruningStrategy(Protocol):
    """Chooses what of a history to keep under a token budget."""

    @property
    def name(self) -> str:
        """A short name for reports."""
        ...

    async def prune(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Return the units to keep, in order, and a report.

        Must keep whole units in their order, never drop pinned units, and change nothing
        when the units already fit.
        """
        ...


@runtime_checkable
class Summarizer(Protocol):
    """Writes the text of a summary of history entries."""

    async def summarize(self, entries: Sequence[HistoryEntry], *, max_tokens: int) -> str:
        """Return a summary of `entries` of at most `max_tokens` tokens."""
        ...


def _total(units: Sequence[Unit]) -> int:
    return sum(u.tokens for u in units)


def _ids(units: Sequence[Unit]) -> tuple[str, ...]:
    return tuple(e.id for u in units for e in u.entries)


def _unchanged(name: str, units: Sequence[Unit], max_tokens: int) -> PruneResult:
    total = _total(units)
    report = PruneReport(
        strategy=name,
        tokens_before=total,
        tokens_after=total,
        max_tokens=max_tokens,
        fits=total <= max_tokens,
    )
    return PruneResult(tuple(units), report)


def _check_budget(max_tokens: int) -> None:
    if max_tokens < 0:
        raise UserError(f"max_tokens must be zero or more, got {max_tokens}")


def _keep(
    name: str, units: Sequence[Unit], drop: set[int], max_tokens: int, before: int
) -> PruneResult:
    kept = tuple(u for i, u in enumerate(units) if i not in drop)
    after = _total(kept)
    report = PruneReport(
        strategy=name,
        tokens_before=before,
        tokens_after=after,
        max_tokens=max_tokens,
        dropped=_ids([units[i] for i in sorted(drop)]),
        fits=after <= max_tokens,
    )
    return PruneResult(kept, report)


class DropOldest:
    """Drop the oldest units that are not pinned until the rest fits.

    Only pinned units (the first user message and summaries) are never dropped, so the result
    fits whenever they do.
    """

    name = "drop_oldest"

    async def prune(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Drop the oldest non-pinned units, one at a time, until the total fits."""
        _check_budget(max_tokens)
        before = total = _total(units)
        if total <= max_tokens:
            return _unchanged(self.name, units, max_tokens)
        drop: set[int] = set()
        for index, unit in enumerate(units):
            if total <= max_tokens:
                break
            if not unit.pinned:
                drop.add(index)
                total -= unit.tokens
        return _keep(self.name, units, drop, max_tokens, before)

    def __repr__(self) -> str:
        return "DropOldest()"


class SlidingWindow:
    """Keep the pinned units and at most the last `turns` turns.

    A turn starts at a user message and runs to the next one (units before the first user
    message form a turn of their own). When the window does not fit, it narrows a turn at a
    time down to the last turn alone; then ``fits`` may be False, and a following strategy
    (e.g. ``Chain(SlidingWindow(5), DropOldest())``) must do the rest. In a one-task run the
    whole run is a single turn.

    Args:
        turns: How many of the latest turns the window keeps at most (at least 1).
    """

    name = "sliding_window"

    def __init__(self, turns: int) -> None:
        if turns < 1:
            raise UserError(f"SlidingWindow needs turns >= 1, got {turns}")
        self.turns = turns

    async def prune(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Drop every non-pinned unit before the widest window of turns that fits."""
        _check_budget(max_tokens)
        before = _total(units)
        if before <= max_tokens or not units:
            return _unchanged(self.name, units, max_tokens)
        starts = [i for i, u in enumerate(units) if u.kind == "user"]
        if not starts or starts[0] != 0:
            starts.insert(0, 0)
        # Tokens of everything from index i on, and of the pinned units before i.
        suffix = [0] * (len(units) + 1)
        for i in range(len(units) - 1, -1, -1):
            suffix[i] = suffix[i + 1] + units[i].tokens
        pinned_before = [0] * (len(units) + 1)
        for i, unit in enumerate(units):
            pinned_before[i + 1] = pinned_before[i] + (unit.tokens if unit.pinned else 0)
        cut = starts[-1]
        for count in range(min(self.turns, len(starts)), 0, -1):
            candidate = starts[-count]
            if pinned_before[candidate] + suffix[candidate] <= max_tokens:
                cut = candidate
                break
        drop = {i for i in range(cut) if not units[i].pinned}
        return _keep(self.name, units, drop, max_tokens, before)

    def __repr__(self) -> str:
        return f"SlidingWindow(turns={self.turns})"


def elision_marker(tokens: int, tool_name: str) -> str:
    """Return the text that replaces an elided tool-result body."""
    return f"[elided {tokens:,} tokens of {tool_name} output]"


class ElideToolResults:
    """Replace the bodies of older tool results by a short marker, oldest first, until it fits.

    The last `keep_last` results are never touched, nor results already elided; the call and
    its result stay (the result's ``elided_tokens`` says how much was removed), so the model
    knows the call happened and can repeat it. A body is elided only when the marker is
    cheaper. Nothing is dropped, so ``fits`` may be False: chain it with a dropping strategy.

    Args:
        keep_last: How many of the latest tool results keep their bodies.
    """

    name = "elide_tool_results"

    def __init__(self, keep_last: int = 2) -> None:
        if keep_last < 0:
            raise UserError(f"ElideToolResults needs keep_last >= 0, got {keep_last}")
        self.keep_last = keep_last

    async def prune(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Elide the oldest eligible tool results until the total fits."""
        _check_budget(max_tokens)
        before = total = _total(units)
        if total <= max_tokens:
            return _unchanged(self.name, units, max_tokens)
        # Spare the last `keep_last` results: find where they start, from the end.
        stop_unit, stop_entry, spared = len(units), 0, 0
        for ui in range(len(units) - 1, -1, -1):
            if spared >= self.keep_last:
                break
            entries = units[ui].entries
            for ei in range(len(entries) - 1, -1, -1):
                if isinstance(entries[ei], ToolResult):
                    spared += 1
                    stop_unit, stop_entry = ui, ei
                    if spared >= self.keep_last:
                        break
        replaced: dict[int, dict[int, tuple[ToolResult, int]]] = {}
        elided: list[str] = []
        for ui in range(min(stop_unit + 1, len(units))):
            if total <= max_tokens:
                break
            unit = units[ui]
            if unit.kind != "assistant":
                continue
            limit = stop_entry if ui == stop_unit else len(unit.entries)
            sent: dict[str | None, int] | None = None
            for ei in range(limit):
                result = unit.entries[ei]
                if not isinstance(result, ToolResult) or result.elided_tokens is not None:
                    continue
                if total <= max_tokens:
                    break
                body = counter.count(result.content)
                shorter = result.model_copy(
                    update={
                        "content": elision_marker(body, result.tool_name),
                        "elided_tokens": body,
                    }
                )
                if sent is None:
                    sent = {
                        m.tool_call_id: t
                        for m, t in zip(unit.messages, unit.message_tokens, strict=True)
                    }
                cost = counter.count_message(_tool_message(shorter))
                saved = sent[result.call_id] - cost
                if saved <= 0:
                    continue
                replaced.setdefault(ui, {})[ei] = (shorter, cost)
                elided.append(result.id)
                total -= saved
        if not elided:
            return _unchanged(self.name, units, max_tokens)
        new_units = [
            _replace_results(unit, replaced[ui], counter) if ui in replaced else unit
            for ui, unit in enumerate(units)
        ]
        after = _total(new_units)
        report = PruneReport(
            strategy=self.name,
            tokens_before=before,
            tokens_after=after,
            max_tokens=max_tokens,
            elided=tuple(elided),
            fits=after <= max_tokens,
        )
        return PruneResult(tuple(new_units), report)

    def __repr__(self) -> str:
        return f"ElideToolResults(keep_last={self.keep_last})"


# A summary with less room than this for its text is not worth writing.
_MIN_SUMMARY_TEXT_TOKENS = 8


class SummarizeOldest:
    """Fold the oldest units into one `Summary` written by `summarizer`.

    The folded span starts at the oldest unit and grows until the rest plus a summary of at
    most `max_summary_tokens` fits (or until only the last `keep_last_units` units are left).
    The pinned first user message is never folded; earlier summaries in the span are folded
    into the new one, so summaries do not pile up. The summary takes the place of the last
    folded unit. If no useful summary fits, or it would save nothing, nothing changes
    (``fits=False``); otherwise the result fits.

    Args:
        summarizer: Writes the summary text.
        keep_last_units: How many of the latest units are never folded.
        max_summary_tokens: The most prompt tokens the summary message may cost.
    """

    name = "summarize_oldest"

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        keep_last_units: int = 4,
        max_summary_tokens: int = 512,
    ) -> None:
        if keep_last_units < 0:
            raise UserError(f"SummarizeOldest needs keep_last_units >= 0, got {keep_last_units}")
        if max_summary_tokens < 1:
            raise UserError(
                f"SummarizeOldest needs max_summary_tokens >= 1, got {max_summary_tokens}"
            )
        self.summarizer = summarizer
        self.keep_last_units = keep_last_units
        self.max_summary_tokens = max_summary_tokens

    async def prune(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Summarize as few of the oldest units as make the rest fit with the summary."""
        _check_budget(max_tokens)
        before = _total(units)
        if before <= max_tokens:
            return _unchanged(self.name, units, max_tokens)
        foldable = [
            i
            for i in range(max(0, len(units) - self.keep_last_units))
            if not (units[i].pinned and units[i].kind == "user")
        ]
        fold: list[int] = []
        kept = before
        for index in foldable:
            fold.append(index)
            kept -= units[index].tokens
            if kept + self.max_summary_tokens <= max_tokens:
                break
        cap = min(self.max_summary_tokens, max_tokens - kept)
        header = counter.count_message(_summary_message(""))
        if not fold or cap - header < _MIN_SUMMARY_TEXT_TOKENS:
            return _unchanged(self.name, units, max_tokens)
        folded = await _fold_units(units, fold, self.summarizer, cap, counter)
        if folded is None:
            return _unchanged(self.name, units, max_tokens)
        new_units, summary = folded
        after = _total(new_units)
        if after >= before:
            return _unchanged(self.name, units, max_tokens)
        report = PruneReport(
            strategy=self.name,
            tokens_before=before,
            tokens_after=after,
            max_tokens=max_tokens,
            summarized=summary.replaced_ids,
            summary_id=summary.id,
            fits=after <= max_tokens,
        )
        return PruneResult(tuple(new_units), report)

    def __repr__(self) -> str:
        return (
            f"SummarizeOldest({self.summarizer!r}, keep_last_units={self.keep_last_units}, "
            f"max_summary_tokens={self.max_summary_tokens})"
        )


class Chain:
    """Apply strategies in order, each to the previous one's result, until the budget holds.

    The report merges what each applied strategy did; its ``steps`` holds their own reports.

    Args:
        *strategies: The strategies, gentlest first (e.g. elide, then summarize, then drop).
    """

    def __init__(self, *strategies: PruningStrategy) -> None:
        if not strategies:
            raise UserError("Chain needs at least one strategy, got none")
        self.strategies = strategies

    @property
    def name(self) -> str:
        """``chain(a, b, ...)`` with the names of the strategies."""
        return f"chain({', '.join(s.name for s in self.strategies)})"

    async def prune(
        self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter
    ) -> PruneResult:
        """Run each strategy while the units do not fit."""
        _check_budget(max_tokens)
        before = _total(units)
        current = tuple(units)
        steps: list[PruneReport] = []
        for strategy in self.strategies:
            if _total(current) <= max_tokens:
                break
            result = await strategy.prune(current, max_tokens, counter)
            current = result.units
            steps.append(result.report)
        after = _total(current)
        summary_ids = [s.summary_id for s in steps if s.summary_id is not None]
        report = PruneReport(
            strategy=self.name,
            tokens_before=before,
            tokens_after=after,
            max_tokens=max_tokens,
            dropped=tuple(i for s in steps for i in s.dropped),
            elided=tuple(i for s in steps for i in s.elided),
            summarized=tuple(i for s in steps for i in s.summarized),
            summary_id=summary_ids[-1] if summary_ids else None,
            fits=after <= max_tokens,
            steps=tuple(steps),
        )
        return PruneResult(current, report)

    def __repr__(self) -> str:
        return f"Chain({', '.join(repr(s) for s in self.strategies)})"


# -- the extractive summarizer ------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_SPACES = re.compile(r"\s+")
_SENTENCE_CHARS = 160
_ARGS_CHARS = 80
_VALUE_CHARS = 30


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first_sentence(text: str) -> str:
    flat = _SPACES.sub(" ", text).strip()
    if not flat:
        return "(empty)"
    return _shorten(_SENTENCE_END.split(flat, maxsplit=1)[0], _SENTENCE_CHARS)


def _short_arguments(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return _shorten(_SPACES.sub(" ", arguments).strip(), _ARGS_CHARS)
    if isinstance(parsed, dict):
        parts = [
            f"{key}={_shorten(json.dumps(value, ensure_ascii=False), _VALUE_CHARS)}"
            for key, value in parsed.items()
        ]
        return _shorten(", ".join(parts), _ARGS_CHARS)
    return _shorten(json.dumps(parsed, ensure_ascii=False), _ARGS_CHARS)


def _outcome(result: ToolResult) -> str:
    if result.elided_tokens is not None:
        status = "error" if result.is_error else "ok"
        return f"{status}, {result.elided_tokens:,} tokens (elided)"
    if result.is_error:
        return f"error: {_first_sentence(result.content)}"
    return f"ok, {len(result.content):,} chars"


class ExtractiveSummarizer:
    """Summarize entries as bullet lines of who said or did what, without a model.

    One line per user message and agent message (its first sentence), one per tool call (the
    tool, short arguments, and whether its result was ok — with its size — or an error); lines
    of earlier summaries are carried over; thinking is left out. When the lines exceed
    `max_tokens`, the oldest and newest are kept and a line says how many were left out
    between them. Deterministic: the same entries give the same text.

    Args:
        counter: Counts tokens for `max_tokens`; defaults to `default_counter()`.
    """

    def __init__(self, *, counter: TokenCounter | None = None) -> None:
        self.counter: TokenCounter = counter if counter is not None else default_counter()

    def lines(self, entries: Sequence[HistoryEntry]) -> list[str]:
        """Return the bullet lines for `entries`, before any truncation."""
        lines: list[str] = []
        calls: dict[str, int] = {}
        for entry in entries:
            if isinstance(entry, UserMessage):
                lines.append(f"- User: {_first_sentence(entry.content)}")
            elif isinstance(entry, AgentMessage):
                lines.append(f"- Agent: {_first_sentence(entry.content)}")
            elif isinstance(entry, ToolCall):
                calls[entry.call_id] = len(lines)
                lines.append(
                    f"- Agent called {entry.name}({_short_arguments(entry.arguments)}) → no result"
                )
            elif isinstance(entry, ToolResult):
                index = calls.pop(entry.call_id, None)
                if index is None:
                    lines.append(f"- {entry.tool_name} returned {_outcome(entry)}")
                else:
                    call_line = lines[index].removesuffix(" → no result")
                    lines[index] = f"{call_line} → {_outcome(entry)}"
            elif isinstance(entry, Summary):
                for line in entry.content.splitlines():
                    stripped = line.strip()
                    if stripped and stripped != SUMMARY_PREFIX:
                        lines.append(stripped if stripped.startswith("- ") else f"- {stripped}")
            elif isinstance(entry, AgentThinking):
                continue
        return lines

    async def summarize(self, entries: Sequence[HistoryEntry], *, max_tokens: int) -> str:
        """Return the bullet lines for `entries`, cut to at most `max_tokens` tokens."""
        return self._fit(self.lines(entries), max_tokens)

    def _fit(self, lines: list[str], max_tokens: int) -> str:
        count = self.counter.count
        text = "\n".join(lines)
        if count(text) <= max_tokens:
            return text
        costs = [count(line) + 1 for line in lines]

        def marker(omitted: int) -> str:
            return f"- … {omitted:,} more events omitted"

        budget = max_tokens - count(marker(len(lines))) - 1
        head: list[int] = []
        tail: list[int] = []
        low, high, used, from_head = 0, len(lines) - 1, 0, True
        while low <= high:
            index = low if from_head else high
            if used + costs[index] > budget:
                break
            used += costs[index]
            if from_head:
                head.append(index)
                low += 1
            else:
                tail.append(index)
                high -= 1
            from_head = not from_head
        # Per-line costs are an estimate of the joined text's; trim until the real count fits.
        while True:
            kept = head + tail[::-1]
            omitted = len(lines) - len(kept)
            text = "\n".join(
                [lines[i] for i in head] + [marker(omitted)] + [lines[i] for i in tail[::-1]]
            )
            if count(text) <= max_tokens:
                return text
            if not head and not tail:
                # Not even the marker fits: keep what fits of the oldest lines instead.
                return truncate_to_tokens("\n".join(lines), max_tokens, count)
            if len(head) > len(tail):
                head.pop()
            else:
                tail.pop()

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(counter={self.counter.name!r})"
