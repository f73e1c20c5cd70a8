"""The history entry models: the six kinds of entry, their tagged union and its JSON form.

A history is a list of entries (`UserMessage`, `AgentMessage`, `AgentThinking`, `ToolCallEntry`,
`ToolResultEntry`, `Summary`), each a frozen pydantic model with an ``id`` and a ``timestamp``,
tagged by ``kind``. `HistoryEntry` is their discriminated union; `HISTORY_ENTRY_ADAPTER` and
`HISTORY_ENTRIES_ADAPTER` validate and serialize it, and `dump_entries` / `load_entries` are the
persisted form of a history. How entries group into units and render to messages is
`agent_flow.history.units`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Literal, TypeAlias

from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    TypeAdapter,
    field_validator,
    model_validator,
)

from agent_flow._types import FrozenModel
from agent_flow.messages import ToolCall

__all__ = [
    "HISTORY_ENTRIES_ADAPTER",
    "HISTORY_ENTRY_ADAPTER",
    "AgentMessage",
    "AgentThinking",
    "HistoryEntry",
    "Summary",
    "ToolCallEntry",
    "ToolResultEntry",
    "UserMessage",
    "dump_entries",
    "load_entries",
]


#: Entry ids' own generator, seeded from the OS once (and again in a forked child): uuid4 asks
#: the OS for entropy on every call (a system call per entry). Not the `random` module's
#: shared one, which a user may seed (ids would repeat) and Hypothesis watches.
_IDS = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(32)))


def _new_id() -> str:
    # 128 random bits as 32 hex digits, the form uuid4().hex had. An id need only be unique
    # within its history.
    return f"{_IDS.getrandbits(128):032x}"


def _now() -> datetime:
    return datetime.now(UTC)


class _Entry(FrozenModel):
    """Fields every history entry has.

    Attributes:
        id: Unique within a history; pruning reports and summaries refer to entries by it.
        timestamp: When the entry was made (timezone-aware, UTC by default).
    """

    model_config = ConfigDict(extra="forbid")  # frozen: FrozenModel

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


class ToolCallEntry(_Entry):
    """A tool call the model made, as the history records it.

    The entry holds the very `ToolCall` the model layer produced (the one call type of
    agent_flow), so its arguments are parsed once however often the call is read.

    Attributes:
        call: The call: its id ties it to its result (unique within a unit), its name is
            the tool's (never empty in a history), its arguments are the model's raw text.
    """

    kind: Literal["tool_call"] = "tool_call"
    call: ToolCall

    @model_validator(mode="before")
    @classmethod
    def _read_flat_form(cls, data: object) -> object:
        # Sessions and exports written before the call was nested store it flat.
        if isinstance(data, dict) and "call" not in data and "call_id" in data:
            flat = dict(data)
            flat["call"] = {
                "id": flat.pop("call_id"),
                "name": flat.pop("name", ""),
                "arguments": flat.pop("arguments", "{}"),
            }
            return flat
        return data

    @field_validator("call")
    @classmethod
    def _named(cls, call: ToolCall) -> ToolCall:
        if not call.id or not call.name:
            raise ValueError("a recorded tool call needs a non-empty id and tool name")
        return call

    @property
    def call_id(self) -> str:
        """The call's id (the key its `ToolResultEntry` answers)."""
        return self.call.id


class ToolResultEntry(_Entry):
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
    UserMessage | AgentMessage | AgentThinking | ToolCallEntry | ToolResultEntry | Summary,
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
