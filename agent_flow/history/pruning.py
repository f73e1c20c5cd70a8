"""Pruning strategies: plain synchronous functions that shrink a history's units to a budget.

A `PruningStrategy` takes the units of a history (see `agent_flow.history.units`), a budget and a
counter, and returns the units to keep with a `PruneReport` of what it did. It is a plain,
synchronous function over plain data: no model, no I/O, so it is fast, deterministic and
property-tested. Every built-in strategy:

- changes nothing when the units already fit (``sum(u.tokens) <= max_tokens``);
- works on whole units (a call is never separated from its result) and keeps their order;
- never drops a pinned unit (the first user message, summaries);
- when the budget cannot be reached, returns its best effort with ``fits=False``.

The strategies: `DropOldest` drops the oldest units; `SlidingWindow` keeps the last turns;
`ElideToolResults` replaces old tool-result bodies by a short marker; `Chain` applies strategies
in order until the budget holds. `History.prune` applies one to a history.

Summarizing is not a strategy: it awaits a model, so it is its own asynchronous step,
`agent_flow.history.summarize.SummarizeOldest`, which may run sync strategies before and after
it. `Chain` refuses it, so that no await hides inside a chain.

Budgets compare with `History.token_count()`: the history's messages without reply priming.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from agent_flow._utils import conforms
from agent_flow.errors import UserError
from agent_flow.history.entries import HistoryEntry, ToolResultEntry
from agent_flow.history.units import Unit, _replace_results, _tool_message
from agent_flow.tokens import TokenCounter

__all__ = [
    "Chain",
    "DropOldest",
    "ElideToolResults",
    "PruneReport",
    "PruneResult",
    "PruningStrategy",
    "SlidingWindow",
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
        steps: For a `Chain` (or a `SummarizeOldest` step with strategies before or after it),
            the report of each step it applied, in order.
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
    """Chooses what of a history to keep under a token budget, synchronously.

    `prune` is a plain function of its arguments: it must not await anything (a strategy that
    needs a model, like summarizing, is an async step instead: see `SummarizeOldest`).
    """

    @property
    def name(self) -> str:
        """A short name for reports."""
        ...

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
        """Return the units to keep, in order, and a report.

        Must keep whole units in their order, never drop pinned units, and change nothing
        when the units already fit.
        """
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

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
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

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
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

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
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
                if isinstance(entries[ei], ToolResultEntry):
                    spared += 1
                    stop_unit, stop_entry = ui, ei
                    if spared >= self.keep_last:
                        break
        replaced: dict[int, dict[int, tuple[ToolResultEntry, int]]] = {}
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
                if not isinstance(result, ToolResultEntry) or result.elided_tokens is not None:
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


class Chain:
    """Apply strategies in order, each to the previous one's result, until the budget holds.

    The report merges what each applied strategy did; its ``steps`` holds their own reports.

    Args:
        *strategies: The strategies, gentlest first (e.g. elide, then drop).

    Raises:
        UserError: No strategy is given, or one is not a `PruningStrategy` (such as
            `SummarizeOldest`, which is an async step of its own).
    """

    def __init__(self, *strategies: PruningStrategy) -> None:
        if not strategies:
            raise UserError("Chain needs at least one strategy, got none")
        for strategy in strategies:
            _check_strategy(strategy)
        self.strategies = strategies

    @property
    def name(self) -> str:
        """``chain(a, b, ...)`` with the names of the strategies."""
        return f"chain({', '.join(s.name for s in self.strategies)})"

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
        """Run each strategy while the units do not fit."""
        _check_budget(max_tokens)
        before = _total(units)
        current = tuple(units)
        steps: list[PruneReport] = []
        for strategy in self.strategies:
            if _total(current) <= max_tokens:
                break
            result = strategy.prune(current, max_tokens, counter)
            current = result.units
            steps.append(result.report)
        return PruneResult(current, _merged_report(self.name, before, current, max_tokens, steps))

    def __repr__(self) -> str:
        return f"Chain({', '.join(repr(s) for s in self.strategies)})"


def _check_strategy(strategy: object) -> None:
    """Raise `UserError` unless `strategy` is a synchronous `PruningStrategy`."""
    if not conforms(strategy, PruningStrategy):  # type: ignore[type-abstract]  # see conforms
        raise UserError(
            f"{strategy!r} is not a PruningStrategy (it needs a `name` and a synchronous "
            "`prune(units, max_tokens, counter)`); a SummarizeOldest step is not one either: "
            "give it the strategies to run around it with SummarizeOldest(..., before=..., "
            "after=...)"
        )
    if inspect.iscoroutinefunction(strategy.prune):
        raise UserError(
            f"strategy {strategy.name!r} has an async prune(); PruningStrategy.prune is "
            "synchronous: make it a plain def (summarizing, which awaits a model, is the "
            "SummarizeOldest step)"
        )


def _merged_report(
    name: str,
    before: int,
    units: Sequence[Unit],
    max_tokens: int,
    steps: Sequence[PruneReport],
) -> PruneReport:
    """Return one report for `steps` applied in order, from `before` tokens to `units`."""
    after = _total(units)
    summary_ids = [s.summary_id for s in steps if s.summary_id is not None]
    return PruneReport(
        strategy=name,
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
