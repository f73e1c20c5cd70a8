"""The conversation history: its entry union, its units of pruning, and the token-cached `History`.

A history is a list of entries (`UserMessage`, `AgentMessage`, `AgentThinking`, `ToolCall`,
`ToolResult`, `Summary`) grouped into **units**, the atoms that pruning keeps or removes whole:

- a `UserMessage` is a unit of its own, and so is a `Summary`;
- an assistant unit is one turn of the model: its thinking, its text and its tool calls, plus
  the results of those calls. A `ToolResult` must answer a call of the current (last) unit;
  anything else raises `UserError`. An assistant entry arriving after a result starts a new
  unit, since the model only speaks again once it has seen the results.

Each unit renders to the neutral `ChatMessage` form: a user message, a summary (a user message
prefixed ``[Summary of earlier conversation]``), or an assistant message carrying the unit's
text and its *answered* tool calls, followed by one tool message per answered call, in call
order. Calls still waiting for their result are left out of the messages (the unit keeps them),
so a prompt never holds a call without its result nor a result without its call. Thinking is
kept in the history but never sent.

Token counts are computed once per message with ``counter.count_message`` and cached in the
unit; adding an entry recounts only the messages of the last unit that changed and updates a
running total, so `History.token_count` is O(1) and `History.add` costs O(the entry), not
O(the history). The flat message list is extended in place and rebuilt only when pruning or
summarizing replaces units. The invariant, property-tested::

    history.token_count() + REPLY_PRIMING_TOKENS == counter.count_messages(history.to_messages())

The first user message and every summary are *pinned*: strategies never drop them.
`History.summarize` and `SummarizeOldest` fold earlier summaries into the new one rather than
stacking summaries, and never fold the first user message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias, TypeVar, overload
from uuid import uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from agent_flow.errors import UserError
from agent_flow.messages import ChatMessage, ToolCallRequest
from agent_flow.tokens import TokenCounter, default_counter

if TYPE_CHECKING:
    from agent_flow.pruning import PruneReport, PruningStrategy, Summarizer

__all__ = [
    "DEFAULT_SUMMARY_TOKENS",
    "HISTORY_ENTRIES_ADAPTER",
    "HISTORY_ENTRY_ADAPTER",
    "SUMMARY_PREFIX",
    "AgentMessage",
    "AgentThinking",
    "History",
    "HistoryEntry",
    "Summary",
    "ToolCall",
    "ToolResult",
    "Unit",
    "UnitKind",
    "UserMessage",
    "build_units",
    "dump_entries",
    "load_entries",
    "truncate_to_tokens",
]

#: The first line of the user message a `Summary` is sent as.
SUMMARY_PREFIX = "[Summary of earlier conversation]"

#: The default cap, in prompt tokens, of a summary made by `History.summarize`.
DEFAULT_SUMMARY_TOKENS = 512


def _new_id() -> str:
    return uuid4().hex


def _now() -> datetime:
    return datetime.now(UTC)


class _Entry(BaseModel):
    """Fields every history entry has.

    Attributes:
        id: Unique within a history; pruning reports and summaries refer to entries by it.
        timestamp: When the entry was made (timezone-aware, UTC by default).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=_new_id, min_length=1)
    timestamp: AwareDatetime = Field(default_factory=_now)


class UserMessage(_Entry):
    """A message from the user (the first one is the task, and is pinned)."""

    kind: Literal["user_message"] = "user_message"
    content: str


class AgentMessage(_Entry):
    """Text the model wrote in its answer."""

    kind: Literal["agent_message"] = "agent_message"
    content: str


class AgentThinking(_Entry):
    """The model's reasoning; kept in the history, never sent back (costs no prompt tokens)."""

    kind: Literal["agent_thinking"] = "agent_thinking"
    content: str


class ToolCall(_Entry):
    """A tool call the model made.

    Attributes:
        call_id: The provider's id tying the call to its result (unique within a unit).
        name: The tool name.
        arguments: The arguments exactly as the model wrote them (JSON text, perhaps invalid).
    """

    kind: Literal["tool_call"] = "tool_call"
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = "{}"


class ToolResult(_Entry):
    """The result of a tool call.

    Attributes:
        call_id: The call this answers; it must be a call of the same unit.
        tool_name: The tool's name, the same as the call's.
        content: What the model is shown.
        is_error: Whether the tool failed (the content then says why).
        elided_tokens: Set when pruning replaced the body by a marker: the tokens it had.
    """

    kind: Literal["tool_result"] = "tool_result"
    call_id: str = Field(min_length=1)
    tool_name: str = Field(min_length=1)
    content: str
    is_error: bool = False
    elided_tokens: int | None = Field(default=None, ge=0)


class Summary(_Entry):
    """A summary standing in for the entries it replaced (pinned; sent as a user message).

    Attributes:
        content: The summary text.
        replaced_ids: Ids of the entries it replaced, in their original order.
    """

    kind: Literal["summary"] = "summary"
    content: str
    replaced_ids: tuple[str, ...] = ()


HistoryEntry: TypeAlias = Annotated[
    UserMessage | AgentMessage | AgentThinking | ToolCall | ToolResult | Summary,
    Field(discriminator="kind"),
]

#: Validates and serializes one history entry (JSON tag: ``kind``).
HISTORY_ENTRY_ADAPTER: TypeAdapter[HistoryEntry] = TypeAdapter(HistoryEntry)
#: Validates and serializes a list of history entries, the persisted form of a history.
HISTORY_ENTRIES_ADAPTER: TypeAdapter[list[HistoryEntry]] = TypeAdapter(list[HistoryEntry])


def dump_entries(entries: Iterable[HistoryEntry]) -> str:
    """Return `entries` as a JSON array."""
    return HISTORY_ENTRIES_ADAPTER.dump_json(list(entries)).decode()


def load_entries(data: str | bytes) -> list[HistoryEntry]:
    """Parse a JSON array written by `dump_entries`.

    Raises:
        pydantic.ValidationError: The JSON is malformed or an entry is invalid.
    """
    return HISTORY_ENTRIES_ADAPTER.validate_json(data)


UnitKind: TypeAlias = Literal["user", "assistant", "summary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """A run of entries that pruning keeps or removes whole.

    Attributes:
        entries: The unit's entries, in order.
        messages: What the unit sends to the model (may be empty, e.g. thinking alone).
        tokens: ``sum(counter.count_message(m) for m in messages)``.
        pinned: True for the first user message and for every summary.
        kind: ``"user"``, ``"assistant"`` or ``"summary"``.
        message_tokens: The count of each message, aligned with `messages`.
        pending: The unit's calls still without a result (left out of `messages`).
    """

    entries: tuple[HistoryEntry, ...]
    messages: tuple[ChatMessage, ...]
    tokens: int
    pinned: bool
    kind: UnitKind
    message_tokens: tuple[int, ...]
    pending: tuple[ToolCall, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        """The ids of the unit's entries, in order."""
        return tuple(e.id for e in self.entries)


def _summary_message(content: str) -> ChatMessage:
    return ChatMessage(role="user", content=f"{SUMMARY_PREFIX}\n{content}")


def _tool_message(result: ToolResult) -> ChatMessage:
    return ChatMessage(
        role="tool", content=result.content, tool_call_id=result.call_id, name=result.tool_name
    )


def _kind_of(entry: HistoryEntry) -> UnitKind:
    if isinstance(entry, UserMessage):
        return "user"
    if isinstance(entry, Summary):
        return "summary"
    return "assistant"


class _UnitBuilder:
    """The mutable state of the last unit, so that adding to it recounts only what changed."""

    __slots__ = (
        "calls",
        "counter",
        "entries",
        "head",
        "head_tokens",
        "kind",
        "pinned",
        "requests",
        "results",
        "texts",
        "tool_messages",
    )

    def __init__(self, counter: TokenCounter, kind: UnitKind, pinned: bool) -> None:
        self.counter = counter
        self.kind: UnitKind = kind
        self.pinned = pinned
        self.entries: list[HistoryEntry] = []
        self.texts: list[str] = []
        self.calls: dict[str, ToolCall] = {}
        self.requests: dict[str, ToolCallRequest] = {}
        self.results: dict[str, ToolResult] = {}
        # The unit's first message: the user/summary message, or the assistant message.
        self.head: ChatMessage | None = None
        self.head_tokens = 0
        self.tool_messages: dict[str, tuple[ChatMessage, int]] = {}

    @classmethod
    def from_unit(cls, unit: Unit, counter: TokenCounter) -> _UnitBuilder:
        """Rebuild the state of `unit` from its cached messages, without recounting."""
        builder = cls(counter, unit.kind, unit.pinned)
        builder.entries = list(unit.entries)
        for entry in unit.entries:
            if isinstance(entry, AgentMessage) and entry.content:
                builder.texts.append(entry.content)
            elif isinstance(entry, ToolCall):
                builder.calls[entry.call_id] = entry
                builder.requests[entry.call_id] = _request(entry)
            elif isinstance(entry, ToolResult):
                builder.results[entry.call_id] = entry
        for message, tokens in zip(unit.messages, unit.message_tokens, strict=True):
            if message.role == "tool" and message.tool_call_id is not None:
                builder.tool_messages[message.tool_call_id] = (message, tokens)
            else:
                builder.head, builder.head_tokens = message, tokens
        return builder

    def accepts(self, entry: HistoryEntry) -> bool:
        """Whether `entry` belongs to this unit rather than starting the next one."""
        if self.kind != "assistant":
            return False
        if isinstance(entry, ToolResult):
            return True
        return isinstance(entry, AgentMessage | AgentThinking | ToolCall) and not self.results

    def check(self, entry: HistoryEntry) -> None:
        """Raise `UserError` if `entry` may not join this unit; change nothing."""
        if isinstance(entry, ToolCall) and entry.call_id in self.calls:
            raise UserError(
                f"tool call {entry.id!r} reuses call id {entry.call_id!r} within one assistant "
                "turn; give every call of a turn its own call id"
            )
        if isinstance(entry, ToolResult):
            call = self.calls.get(entry.call_id)
            if call is None:
                raise _unknown_call(entry)
            if entry.call_id in self.results:
                raise UserError(
                    f"tool result {entry.id!r} answers call {entry.call_id!r}, which already has "
                    "a result; add exactly one result per call"
                )
            if call.name != entry.tool_name:
                raise UserError(
                    f"tool result {entry.id!r} names tool {entry.tool_name!r} but its call "
                    f"{entry.call_id!r} is to {call.name!r}; give the result the call's tool name"
                )

    def add(self, entry: HistoryEntry) -> None:
        """Add `entry` (already checked) and recount the messages it changes."""
        self.entries.append(entry)
        if isinstance(entry, UserMessage):
            self._set_head(ChatMessage(role="user", content=entry.content))
        elif isinstance(entry, Summary):
            self._set_head(_summary_message(entry.content))
        elif isinstance(entry, AgentMessage):
            if entry.content:
                self.texts.append(entry.content)
                self._refresh_assistant()
        elif isinstance(entry, ToolCall):
            self.calls[entry.call_id] = entry
            self.requests[entry.call_id] = _request(entry)
        elif isinstance(entry, ToolResult):
            self.results[entry.call_id] = entry
            message = _tool_message(entry)
            self.tool_messages[entry.call_id] = (message, self.counter.count_message(message))
            self._refresh_assistant()
        # AgentThinking changes no message.

    def _set_head(self, message: ChatMessage) -> None:
        self.head, self.head_tokens = message, self.counter.count_message(message)

    def _refresh_assistant(self) -> None:
        content = "\n\n".join(self.texts)
        answered = tuple(r for cid, r in self.requests.items() if cid in self.results)
        if content or answered:
            self._set_head(ChatMessage(role="assistant", content=content, tool_calls=answered))
        else:
            self.head, self.head_tokens = None, 0

    def snapshot(self) -> Unit:
        """Return the unit as it stands."""
        messages: list[ChatMessage] = []
        counts: list[int] = []
        if self.head is not None:
            messages.append(self.head)
            counts.append(self.head_tokens)
        pending: list[ToolCall] = []
        for call_id, call in self.calls.items():
            answer = self.tool_messages.get(call_id)
            if answer is None:
                pending.append(call)
            else:
                messages.append(answer[0])
                counts.append(answer[1])
        return Unit(
            entries=tuple(self.entries),
            messages=tuple(messages),
            tokens=sum(counts),
            pinned=self.pinned,
            kind=self.kind,
            message_tokens=tuple(counts),
            pending=tuple(pending),
        )


def _request(call: ToolCall) -> ToolCallRequest:
    return ToolCallRequest(id=call.call_id, name=call.name, arguments=call.arguments)


def _unknown_call(result: ToolResult) -> UserError:
    return UserError(
        f"tool result {result.id!r} answers call {result.call_id!r}, which is not a call of the "
        "current assistant turn; add the ToolCall (and nothing else in between but other calls "
        "and results of that turn) before its result"
    )


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

    def pending_calls(self) -> list[ToolCall]:
        """Return the calls of the last unit still waiting for their result, in call order.

        Calls left without a result in earlier units can no longer be answered (a result must
        answer a call of the last unit); they stay in the history and are never sent.
        """
        return list(self._units[-1].pending) if self._units else []

    # -- writing -----------------------------------------------------------------------

    def add(self, entry: HistoryEntry) -> None:
        """Append `entry`, recounting only the messages of the last unit that it changes.

        Raises:
            UserError: The entry's id is already used; a `ToolResult` answers no call of the
                last unit, or a call that has its result, or names another tool than its
                call; a `ToolCall` reuses a call id of its unit. The history is unchanged.
        """
        if entry.id in self._ids:
            raise UserError(
                f"entry id {entry.id!r} is already in the history; give every entry its own id"
            )
        builder = self._last_builder()
        if builder is not None and builder.accepts(entry):
            builder.check(entry)
            builder.add(entry)
            old, new = self._units[-1], builder.snapshot()
            self._units[-1] = new
            self._total += new.tokens - old.tokens
            del self._messages[self._tail_start :]
            self._messages.extend(new.messages)
        elif isinstance(entry, ToolResult):
            raise _unknown_call(entry)
        else:
            pinned = isinstance(entry, Summary) or (
                isinstance(entry, UserMessage) and not self._has_first_user
            )
            builder = _UnitBuilder(self._counter, _kind_of(entry), pinned)
            builder.add(entry)
            unit = builder.snapshot()
            self._units.append(unit)
            self._open = builder
            self._total += unit.tokens
            if pinned:
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

    async def prune(self, strategy: PruningStrategy, max_tokens: int) -> PruneReport:
        """Shrink the history with `strategy` so that `token_count()` fits `max_tokens`.

        The strategy sees a snapshot of the units; its result replaces them (units it kept are
        reused with their cached counts, others are recounted). Strategies never drop pinned
        units; when even those do not fit, the report says ``fits=False``.

        Do not prune between adding an assistant turn and adding its results: a dropped call
        can no longer be answered.

        Args:
            strategy: What to keep, drop, elide or summarize.
            max_tokens: The budget for `token_count()` (reply priming not included).

        Returns:
            The strategy's report of what it did.

        Raises:
            UserError: `max_tokens` is negative, the history changed while the strategy was
                running, or the strategy returned units that break the unit rules.
        """
        if max_tokens < 0:
            raise UserError(f"max_tokens must be zero or more, got {max_tokens}")
        version = self._version
        snapshot = tuple(self._units)
        result = await strategy.prune(snapshot, max_tokens, self._counter)
        self._check_unchanged(version, f"strategy {strategy.name!r} was pruning it")
        if len(result.units) != len(snapshot) or any(
            a is not b for a, b in zip(result.units, snapshot, strict=True)
        ):
            self._replace_units(result.units, snapshot)
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
        if not 0 <= start < end <= len(self._entries):
            raise UserError(
                f"summarize needs 0 <= start < end <= {len(self._entries)}, got start={start} "
                f"end={end}"
            )
        first_unit = last_unit = -1
        offset = 0
        for index, unit in enumerate(self._units):
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
            if not (self._units[i].pinned and self._units[i].kind == "user")
        ]
        if not fold:
            raise UserError(
                f"entries {start}..{end} hold only the pinned first user message, which is never "
                "summarized; choose a span with other entries"
            )
        if fold[-1] == len(self._units) - 1 and self._units[-1].pending:
            raise UserError(
                f"entries {start}..{end} include calls still waiting for their results "
                f"({', '.join(c.call_id for c in self._units[-1].pending)}); add the results "
                "first or end the span before that turn"
            )
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
                "do not add entries while prune() or summarize() is running"
            )

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


def build_units(entries: Iterable[HistoryEntry], counter: TokenCounter) -> list[Unit]:
    """Group `entries` into units and count them, as a fresh `History` would.

    Raises:
        UserError: The entries break the unit rules (see `History.add`).
    """
    return list(History(entries, counter=counter).units())


def _replace_results(
    unit: Unit, results: dict[int, tuple[ToolResult, int]], counter: TokenCounter
) -> Unit:
    """Return `unit` with the entries at the given indices replaced by other results.

    `results` maps an entry index to the new result and the count of its tool message (as
    ``counter.count_message`` gives it). Each new result must answer the same call as the one
    it replaces; the other messages keep their cached counts.
    """
    entries = list(unit.entries)
    messages = list(unit.messages)
    counts = list(unit.message_tokens)
    where = {m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool"}
    for index, (result, tokens) in results.items():
        old = entries[index]
        if not isinstance(old, ToolResult) or (old.call_id, old.tool_name) != (
            result.call_id,
            result.tool_name,
        ):
            raise UserError(
                f"result {result.id!r} cannot replace entry {old.id!r}: it must answer the same "
                "call of the same tool"
            )
        entries[index] = result
        at = where[result.call_id]
        messages[at], counts[at] = _tool_message(result), tokens
    return dataclasses.replace(
        unit,
        entries=tuple(entries),
        messages=tuple(messages),
        message_tokens=tuple(counts),
        tokens=sum(counts),
    )


def _would_merge(previous: Unit, following: Unit) -> bool:
    """Whether grouping would join `following` to `previous` (an assistant turn not answered)."""
    return (
        previous.kind == "assistant"
        and following.kind == "assistant"
        and not any(isinstance(e, ToolResult) for e in previous.entries)
    )


# -- summaries shared by History.summarize and the SummarizeOldest strategy ---------------


def truncate_to_tokens(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """Return `text`, or its longest prefix plus "…" whose `count` is at most `max_tokens`.

    Returns the empty string when not even "…" fits. Costs O(log len(text)) counts.
    """
    if count(text) <= max_tokens:
        return text
    low, high = 0, len(text)  # the longest fitting prefix length lies in [low, high)
    if count("…") > max_tokens:
        return ""
    while high - low > 1:
        middle = (low + high) // 2
        if count(text[:middle].rstrip() + "…") <= max_tokens:
            low = middle
        else:
            high = middle
    return text[:low].rstrip() + "…"


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

    content = truncate_to_tokens(text, max_message_tokens, cost)
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
