"""`History`: the prunable transcript of a run, with cached token counts.

A history holds its entries (`agent_flow.history.entries`) grouped into units
(`agent_flow.history.units`). Token counts are computed once per message with
``counter.count_message`` and cached in the unit; adding an entry recounts only the messages
of the last unit that changed and updates a running total, so `History.token_count` is O(1)
and `History.add` costs O(the entry), not O(the history). The flat message list is extended in
place and rebuilt only when pruning or summarizing replaces units. The invariant,
property-tested::

    history.token_count() + REPLY_PRIMING_TOKENS == counter.count_messages(history.to_messages())

The first user message and every summary are *pinned*: strategies never drop them.
`History.prune` applies a synchronous `PruningStrategy`; summarizing awaits a `Summarizer`,
so it has its own async methods: `History.fold` applies a `SummarizeOldest` step and
`History.summarize` replaces a chosen span. Both fold earlier summaries into the new one
rather than stacking summaries, and never fold the first user message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import TypeVar, overload

from agent_flow.errors import UserError
from agent_flow.history.entries import (
    HistoryEntry,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
    dump_entries,
    load_entries,
)
from agent_flow.history.pruning import PruneReport, PruneResult, PruningStrategy, _check_strategy
from agent_flow.history.summarize import (
    DEFAULT_SUMMARY_TOKENS,
    SummarizeOldest,
    Summarizer,
    _fold_units,
    _span_to_fold,
)
from agent_flow.history.units import (
    SUMMARY_PREFIX,
    Unit,
    _duplicate_id,
    _open_unit,
    _UnitBuilder,
    _unknown_call,
    _would_merge,
    build_units,
)
from agent_flow.messages import ChatMessage
from agent_flow.tokens import TokenCounter, default_counter

__all__ = ["History"]

_T = TypeVar("_T")


class _ListView(Sequence[_T]):
    """A read-only, live view of a list owned by a `History`."""

    __slots__ = ("_items",)

    def __init__(self, items: list[_T]) -> None:
        self._items = items

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[_T, ...]: ...

    def __getitem__(self, index: int | slice) -> _T | tuple[_T, ...]:
        if isinstance(index, slice):
            return tuple(self._items[index])
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[_T]:
        return iter(self._items)

    def __reversed__(self) -> Iterator[_T]:
        return reversed(self._items)

    def __repr__(self) -> str:
        return f"<read-only view of {len(self._items)} items>"


class History:
    """The prunable transcript of a run, with cached token counts.

    Args:
        entries: Entries to start with, added in order with `add`.
        counter: Counts the tokens of each message; defaults to `default_counter()`.

    Raises:
        UserError: An entry breaks the unit rules (see `add`).
    """

    def __init__(
        self, entries: Iterable[HistoryEntry] = (), *, counter: TokenCounter | None = None
    ) -> None:
        self._counter: TokenCounter = counter if counter is not None else default_counter()
        self._entries: list[HistoryEntry] = []
        self._units: list[Unit] = []
        self._messages: list[ChatMessage] = []
        self._ids: set[str] = set()
        self._total = 0
        # Pinned units (first user message, summaries) never grow once added: their indices
        # and total are kept here so budgeting never has to scan every unit.
        self._pinned: list[int] = []
        self._pinned_total = 0
        self._version = 0
        self._replaced_version = 0
        self._has_first_user = False
        # Builder of the last unit; None until needed again after units were replaced.
        self._open: _UnitBuilder | None = None
        # Where the last unit's messages start in `_messages`.
        self._tail_start = 0
        self.extend(entries)

    # -- reading -----------------------------------------------------------------------

    @property
    def counter(self) -> TokenCounter:
        """The counter every cached count was made with."""
        return self._counter

    @property
    def version(self) -> int:
        """A number that grows with every change (add, prune, summarize)."""
        return self._version

    @property
    def replaced_version(self) -> int:
        """The `version` at which entries were last replaced (prune, fold, summarize); 0 if never.

        Up to `version`, entries were only appended since then.
        """
        return self._replaced_version

    @property
    def entries(self) -> Sequence[HistoryEntry]:
        """A read-only, live view of the entries, in order."""
        return _ListView(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def units(self) -> Sequence[Unit]:
        """Return a read-only, live view of the units, in order (no copy is made)."""
        return _ListView(self._units)

    def token_count(self) -> int:
        """Return the prompt tokens of `to_messages()` without the reply priming, in O(1)."""
        return self._total

    def pinned_token_count(self) -> int:
        """Return the tokens of the pinned units (first user message, summaries), in O(1)."""
        return self._pinned_total

    def pinned_indices(self) -> Sequence[int]:
        """Return the indices into `units()` of the pinned units, in order (no copy is made)."""
        return _ListView(self._pinned)

    def to_messages(self) -> list[ChatMessage]:
        """Return the messages the history sends, as a new list (a copy of a cached one)."""
        return list(self._messages)

    def pending_calls(self) -> list[ToolCallEntry]:
        """Return the calls of the last unit still waiting for their result, in call order.

        Calls left without a result in earlier units can no longer be answered (a result must
        answer a call of the last unit); they stay in the history and are never sent.
        """
        return list(self._units[-1].pending) if self._units else []

    # -- writing -----------------------------------------------------------------------

    def add(self, entry: HistoryEntry) -> None:
        """Append `entry`, recounting only the messages of the last unit that it changes.

        Raises:
            UserError: The entry's id is already used; a `ToolResultEntry` answers no call of the
                last unit, or a call that has its result, or names another tool than its
                call; a `ToolCallEntry` reuses a call id of its unit. The history is unchanged.
        """
        if entry.id in self._ids:
            raise _duplicate_id(entry)
        builder = self._last_builder()
        if builder is not None and builder.accepts(entry):
            builder.check(entry)
            builder.add(entry)
            old, new = self._units[-1], builder.snapshot()
            self._units[-1] = new
            self._total += new.tokens - old.tokens
            del self._messages[self._tail_start :]
            self._messages.extend(new.messages)
        elif isinstance(entry, ToolResultEntry):
            raise _unknown_call(entry)
        else:
            builder = _open_unit(entry, self._counter, has_first_user=self._has_first_user)
            unit = builder.snapshot()
            self._units.append(unit)
            self._open = builder
            self._total += unit.tokens
            if unit.pinned:
                self._pinned.append(len(self._units) - 1)
                self._pinned_total += unit.tokens
            self._tail_start = len(self._messages)
            self._messages.extend(unit.messages)
            if isinstance(entry, UserMessage):
                self._has_first_user = True
        self._entries.append(entry)
        self._ids.add(entry.id)
        self._version += 1

    def extend(self, entries: Iterable[HistoryEntry]) -> None:
        """Add `entries` in order; on an error, the entries before the bad one stay added."""
        for entry in entries:
            self.add(entry)

    def _last_builder(self) -> _UnitBuilder | None:
        if self._open is None and self._units:
            self._open = _UnitBuilder.from_unit(self._units[-1], self._counter)
        return self._open

    def prune(self, strategy: PruningStrategy, max_tokens: int) -> PruneReport:
        """Shrink the history with `strategy` so that `token_count()` fits `max_tokens`.

        Synchronous, like the strategy: nothing is awaited. The strategy sees a snapshot of the
        units; its result replaces them (units it kept are reused with their cached counts,
        others are recounted). Strategies never drop pinned units; when even those do not fit,
        the report says ``fits=False``. To summarize, which awaits a model, use `fold`.

        Do not prune between adding an assistant turn and adding its results: a dropped call
        can no longer be answered.

        Args:
            strategy: What to keep, drop or elide.
            max_tokens: The budget for `token_count()` (reply priming not included).

        Returns:
            The strategy's report of what it did.

        Raises:
            UserError: `max_tokens` is negative, `strategy` is not a synchronous
                `PruningStrategy`, or it returned units that break the unit rules.
        """
        if max_tokens < 0:
            raise UserError(f"max_tokens must be zero or more, got {max_tokens}")
        _check_strategy(strategy)
        version = self._version
        snapshot = tuple(self._units)
        result = strategy.prune(snapshot, max_tokens, self._counter)
        self._check_unchanged(version, f"strategy {strategy.name!r} was pruning it")
        self._apply(result, snapshot)
        return result.report

    async def fold(self, step: SummarizeOldest, max_tokens: int) -> PruneReport:
        """Shrink the history with the async summarizing `step` so that it fits `max_tokens`.

        Like `prune`, but the step awaits its summarizer (see `SummarizeOldest`: it may run
        sync strategies before and after the summary). Entries must not be added meanwhile.

        Args:
            step: Which units to fold into a summary, with what, and what to run around it.
            max_tokens: The budget for `token_count()` (reply priming not included).

        Returns:
            The step's report of what it did.

        Raises:
            UserError: `max_tokens` is negative, `step` is not a `SummarizeOldest` (a sync
                strategy goes to `prune`), the history changed while the step was running,
                or the step returned units that break the unit rules.
            ModelError: The summarizer's model failed (from an LLM-backed summarizer).
        """
        if max_tokens < 0:
            raise UserError(f"max_tokens must be zero or more, got {max_tokens}")
        if not isinstance(step, SummarizeOldest):
            raise UserError(
                f"fold() takes a SummarizeOldest step, got {step!r}; apply a synchronous "
                "PruningStrategy with prune()"
            )
        version = self._version
        snapshot = tuple(self._units)
        result = await step.fold(snapshot, max_tokens, self._counter)
        self._check_unchanged(version, f"{step.name!r} was summarizing it")
        self._apply(result, snapshot)
        return result.report

    async def summarize(
        self,
        start: int,
        end: int,
        summarizer: Summarizer,
        *,
        max_tokens: int = DEFAULT_SUMMARY_TOKENS,
    ) -> Summary:
        """Replace the entries ``entries[start:end]`` by one `Summary` made by `summarizer`.

        The span is widened to whole units (a unit is never split). The pinned first user
        message is never summarized: it is left out of the span and stays in place. Summaries
        inside the span are folded into the new one. The new summary takes the place of the
        last unit it replaces.

        Args:
            start: Index of the first entry to summarize.
            end: Index one past the last entry to summarize.
            summarizer: Writes the summary text.
            max_tokens: The most prompt tokens the summary message may cost; longer text from
                the summarizer is cut to fit.

        Returns:
            The new summary; its ``replaced_ids`` lists the entries it replaced, in order.

        Raises:
            UserError: The indices are out of range or empty, the span holds only the pinned
                first user message, it includes calls still waiting for their results,
                `max_tokens` leaves no room for a summary, or the history changed meanwhile.
        """
        fold = _span_to_fold(self._units, len(self._entries), start, end)
        version = self._version
        snapshot = tuple(self._units)
        folded = await _fold_units(snapshot, fold, summarizer, max_tokens, self._counter)
        if folded is None:
            raise UserError(
                f"max_tokens={max_tokens} leaves no room for a summary once its "
                f"{SUMMARY_PREFIX!r} header is paid; raise max_tokens"
            )
        self._check_unchanged(version, "the summarizer was running")
        units, summary = folded
        self._replace_units(units, snapshot)
        return summary

    def _check_unchanged(self, version: int, during: str) -> None:
        if self._version != version:
            raise UserError(
                f"the history changed (version {version} -> {self._version}) while {during}; "
                "do not change the history while prune(), fold() or summarize() is running"
            )

    def _apply(self, result: PruneResult, snapshot: tuple[Unit, ...]) -> None:
        """Make `result` the history unless it kept exactly the units of `snapshot`."""
        if len(result.units) != len(snapshot) or any(
            a is not b for a, b in zip(result.units, snapshot, strict=True)
        ):
            self._replace_units(result.units, snapshot)

    def _replace_units(self, units: Sequence[Unit], previous: Sequence[Unit]) -> None:
        """Make `units` the history, reusing the known ones and validating the rest.

        Units that are not among `previous` are rebuilt from their entries (which checks the
        unit rules and recounts them); adjacent units that the grouping rules would merge are
        merged, so the units always equal `build_units(entries)`. The work beyond flattening
        the lists is proportional to what changed, not to the history.
        """
        position = {id(u): i for i, u in enumerate(previous)}
        merged: list[Unit] = []
        # For each merged unit, its index in `previous` if it is reused as it was, else -1.
        origin: list[int] = []
        for unit in units:
            index = position.get(id(unit), -1)
            if index > 0 and origin and origin[-1] == index - 1:
                # Units that were neighbours before cannot merge: the common, cheap case.
                merged.append(unit)
                origin.append(index)
                continue
            parts = [unit] if index >= 0 else build_units(unit.entries, self._counter)
            for part in parts:
                if merged and _would_merge(merged[-1], part):
                    (merged[-1],) = build_units(merged[-1].entries + part.entries, self._counter)
                    origin[-1] = -1
                else:
                    merged.append(part)
                    origin.append(index if part is unit else -1)
        reused = {i for i in origin if i >= 0}
        if len(reused) != sum(i >= 0 for i in origin):
            raise UserError("the new units repeat a unit; a pruning strategy must keep each once")
        removed_ids = {e.id for i, u in enumerate(previous) if i not in reused for e in u.entries}
        added_ids: set[str] = set()
        for unit, index in zip(merged, origin, strict=True):
            if index >= 0:
                continue
            for entry in unit.entries:
                if entry.id in added_ids or (entry.id in self._ids and entry.id not in removed_ids):
                    raise UserError(
                        f"the new units repeat entry id {entry.id!r}; a pruning strategy must "
                        "keep each entry once"
                    )
                added_ids.add(entry.id)
        has_first_user = False
        for index, unit in enumerate(merged):
            pinned = unit.kind == "summary" or (unit.kind == "user" and not has_first_user)
            has_first_user = has_first_user or unit.kind == "user"
            if unit.pinned != pinned:
                merged[index] = dataclasses.replace(unit, pinned=pinned)
        self._units[:] = merged
        self._entries[:] = chain.from_iterable(u.entries for u in merged)
        self._messages[:] = chain.from_iterable(u.messages for u in merged)
        self._ids -= removed_ids
        self._ids |= added_ids
        self._total = sum(u.tokens for u in merged)
        self._pinned = [i for i, u in enumerate(merged) if u.pinned]
        self._pinned_total = sum(merged[i].tokens for i in self._pinned)
        self._has_first_user = has_first_user
        self._open = None
        self._tail_start = len(self._messages) - (len(merged[-1].messages) if merged else 0)
        self._version += 1
        self._replaced_version = self._version

    # -- persistence -------------------------------------------------------------------

    def to_json(self) -> str:
        """Return the entries as a JSON array (counts are not stored; they are recomputed)."""
        return dump_entries(self._entries)

    @classmethod
    def from_json(cls, data: str | bytes, *, counter: TokenCounter | None = None) -> History:
        """Rebuild a history from `to_json` output.

        Raises:
            pydantic.ValidationError: The JSON is malformed or an entry is invalid.
            UserError: The entries break the unit rules.
        """
        return cls(load_entries(data), counter=counter)

    def __repr__(self) -> str:
        return (
            f"History({len(self._entries)} entries, {len(self._units)} units, "
            f"{self._total} tokens, version {self._version})"
        )
