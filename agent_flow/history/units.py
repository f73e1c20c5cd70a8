"""Units: the runs of history entries that pruning keeps or removes whole, and how they are built.

Entries group into **units**, the atoms that pruning keeps or removes whole:

- a `UserMessage` is a unit of its own, and so is a `Summary`;
- an assistant unit is one turn of the model: its thinking, its text and its tool calls, plus
  the results of those calls. A `ToolResultEntry` must answer a call of the current (last) unit;
  anything else raises `UserError`. An assistant entry arriving after a result starts a new
  unit, since the model only speaks again once it has seen the results.

Each unit renders to the neutral `ChatMessage` form: a user message, a summary (a user message
prefixed ``[Summary of earlier conversation]``), or an assistant message carrying the unit's
text and its *answered* tool calls, followed by one tool message per answered call, in call
order. Calls still waiting for their result are left out of the messages (the unit keeps them),
so a prompt never holds a call without its result nor a result without its call. Thinking is
kept in the history but never sent.

A `Unit` caches the token count of each of its messages. `_UnitBuilder` holds the mutable state
of the last unit of a history, so that adding an entry recounts only the messages it changes;
`build_units` groups and counts a list of entries exactly as a fresh `History` would. The first
user message and every summary are *pinned*: strategies never drop them, and `select_units`
(what a prompt sends when the whole history does not fit) always takes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from agent_flow.errors import UserError
from agent_flow.history.entries import (
    AgentMessage,
    AgentThinking,
    HistoryEntry,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.messages import ChatMessage, ToolCall
from agent_flow.tokens import TokenCounter

__all__ = ["SUMMARY_PREFIX", "Unit", "UnitKind", "build_units", "select_units"]

#: The first line of the user message a `Summary` is sent as.
SUMMARY_PREFIX = "[Summary of earlier conversation]"

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
    pending: tuple[ToolCallEntry, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        """The ids of the unit's entries, in order."""
        return tuple(e.id for e in self.entries)


def _summary_message(content: str) -> ChatMessage:
    return ChatMessage(role="user", content=f"{SUMMARY_PREFIX}\n{content}")


def _tool_message(result: ToolResultEntry) -> ChatMessage:
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
        self.calls: dict[str, ToolCallEntry] = {}
        self.requests: dict[str, ToolCall] = {}
        self.results: dict[str, ToolResultEntry] = {}
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
            elif isinstance(entry, ToolCallEntry):
                builder.calls[entry.call_id] = entry
                builder.requests[entry.call_id] = _request(entry)
            elif isinstance(entry, ToolResultEntry):
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
        if isinstance(entry, ToolResultEntry):
            return True
        return isinstance(entry, AgentMessage | AgentThinking | ToolCallEntry) and not self.results

    def check(self, entry: HistoryEntry) -> None:
        """Raise `UserError` if `entry` may not join this unit; change nothing."""
        if isinstance(entry, ToolCallEntry) and entry.call_id in self.calls:
            raise UserError(
                f"tool call {entry.id!r} reuses call id {entry.call_id!r} within one assistant "
                "turn; give every call of a turn its own call id"
            )
        if isinstance(entry, ToolResultEntry):
            call = self.calls.get(entry.call_id)
            if call is None:
                raise _unknown_call(entry)
            if entry.call_id in self.results:
                raise UserError(
                    f"tool result {entry.id!r} answers call {entry.call_id!r}, which already has "
                    "a result; add exactly one result per call"
                )
            if call.call.name != entry.tool_name:
                raise UserError(
                    f"tool result {entry.id!r} names tool {entry.tool_name!r} but its call "
                    f"{entry.call_id!r} is to {call.call.name!r}; give the result the call's tool "
                    "name"
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
        elif isinstance(entry, ToolCallEntry):
            self.calls[entry.call_id] = entry
            self.requests[entry.call_id] = _request(entry)
        elif isinstance(entry, ToolResultEntry):
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
        pending: list[ToolCallEntry] = []
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


def _request(call: ToolCallEntry) -> ToolCall:
    return call.call


def _unknown_call(result: ToolResultEntry) -> UserError:
    return UserError(
        f"tool result {result.id!r} answers call {result.call_id!r}, which is not a call of the "
        "current assistant turn; add its ToolCallEntry (and nothing else in between but other "
        "calls and results of that turn) before its result"
    )


def _duplicate_id(entry: HistoryEntry) -> UserError:
    return UserError(
        f"entry id {entry.id!r} is already in the history; give every entry its own id"
    )


def _open_unit(entry: HistoryEntry, counter: TokenCounter, *, has_first_user: bool) -> _UnitBuilder:
    """Start the unit `entry` opens: pinned if it is a summary or the first user message."""
    pinned = isinstance(entry, Summary) or (isinstance(entry, UserMessage) and not has_first_user)
    builder = _UnitBuilder(counter, _kind_of(entry), pinned)
    builder.add(entry)
    return builder


def build_units(entries: Iterable[HistoryEntry], counter: TokenCounter) -> list[Unit]:
    """Group `entries` into units and count them, as a fresh `History` would.

    Raises:
        UserError: The entries break the unit rules (see `History.add`).
    """
    units: list[Unit] = []
    builder: _UnitBuilder | None = None
    ids: set[str] = set()
    has_first_user = False
    for entry in entries:
        if entry.id in ids:
            raise _duplicate_id(entry)
        if builder is not None and builder.accepts(entry):
            builder.check(entry)
            builder.add(entry)
        elif isinstance(entry, ToolResultEntry):
            raise _unknown_call(entry)
        else:
            if builder is not None:
                units.append(builder.snapshot())
            builder = _open_unit(entry, counter, has_first_user=has_first_user)
            has_first_user = has_first_user or isinstance(entry, UserMessage)
        ids.add(entry.id)
    if builder is not None:
        units.append(builder.snapshot())
    return units


def _replace_results(
    unit: Unit, results: dict[int, tuple[ToolResultEntry, int]], counter: TokenCounter
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
        if not isinstance(old, ToolResultEntry) or (old.call_id, old.tool_name) != (
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
        and not any(isinstance(e, ToolResultEntry) for e in previous.entries)
    )


def select_units(
    units: Sequence[Unit],
    pinned: Sequence[int],
    pinned_tokens: int,
    budget: int,
    costs: Sequence[int] | None = None,
) -> tuple[list[Unit], int]:
    """Pick the pinned units plus the newest others that fit `budget`, in original order.

    Walks back from the newest unit only as far as the budget reaches, so the cost is
    proportional to what is sent, not to the length of the history. `costs` are the units'
    costs as sent (default: their own counts).

    Returns:
        The units and their total tokens.
    """
    remaining = budget - pinned_tokens
    taken = 0
    for index in range(len(units) - 1, -1, -1):
        unit = units[index]
        if not unit.pinned:
            cost = unit.tokens if costs is None else costs[index]
            if cost > remaining:
                break
            remaining -= cost
        taken += 1
    start = len(units) - taken
    older_pinned = [units[i] for i in pinned if i < start]
    # Every pinned unit is sent, and the others sent cost what the walk took from the budget.
    return [*older_pinned, *units[start:]], budget - remaining
