"""Hypothesis strategies for history entries, valid entry sequences, histories and pruners.

`entry_lists` builds only sequences a real agent can produce, from whole units: user
messages, summaries, and assistant turns (thinking, text, zero to three parallel tool calls,
their results in any order, some erroring, some elided). Entry ids are numbered ("e0", "e1",
...) within one sequence and texts are made of a few small words, so a failing example shrinks
to a short, readable history and replays the same.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from datetime import UTC, datetime

from hypothesis import strategies as st

from agent_flow.history import (
    AgentMessage,
    AgentThinking,
    Chain,
    DropOldest,
    ElideToolResults,
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    PruningStrategy,
    SlidingWindow,
    SummarizeOldest,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.messages import ToolCall
from agent_flow.testing.strategies._text import names, texts
from agent_flow.tokens import ApproxCounter, TokenCounter

__all__ = [
    "entry_lists",
    "histories",
    "history_entries",
    "prose",
    "pruning_strategies",
    "summarize_steps",
    "timestamps",
]

_ID = texts(min_size=1, max_size=20)
_NAME = names(max_size=20)

#: Timezone-aware entry times between 1970 and 2200.
timestamps = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2200, 1, 1),
    timezones=st.just(UTC),
)

#: Integer strategies, built once: a strategy built inside a draw is validated again each
#: time, which was most of the cost of drawing (and shrinking) a history.
_int = functools.cache(st.integers)
_BOOLEANS = st.booleans()

_WORDS = ("read", "the", "file", "parser", "fails", "on", "line", "42", "ok", "fix", "tests", "λ")
_ENDS = (". ", "! ", "? ", "\n")


@st.composite
def prose(draw: st.DrawFn, *, max_words: int = 60) -> str:
    """Sentences of small words: varied lengths, cheap to generate (two draws)."""
    size = draw(_int(0, max_words))
    seed = draw(_int(0, 997))
    sentence = 3 + seed % 9
    parts = []
    for i in range(size):
        parts.append(_WORDS[(seed * 31 + i * (seed % 5 + 1)) % len(_WORDS)])
        parts.append(_ENDS[(seed + i) % len(_ENDS)] if i % sentence == sentence - 1 else " ")
    return "".join(parts).strip()


@st.composite
def _body(draw: st.DrawFn) -> str:
    """A tool-result body: usually short, sometimes thousands of characters."""
    if draw(_int(0, 4)) == 0:
        return "x" * draw(_int(200, 4000))
    return draw(_PROSE)


_PROSE = prose()
_SHORT_PROSE = prose(max_words=20)
_KINDS = st.sampled_from(["user", "assistant", "assistant", "assistant", "summary"])
_KINDS_WITHOUT_SUMMARIES = st.sampled_from(["user", "assistant", "assistant", "assistant"])


def history_entries() -> st.SearchStrategy[HistoryEntry]:
    """Any single entry, with arbitrary text (`ALPHABET` characters) in every field."""
    common = {"id": _ID, "timestamp": timestamps}
    text = texts(max_size=200)
    return st.one_of(
        st.builds(UserMessage, content=text, **common),
        st.builds(AgentMessage, content=text, **common),
        st.builds(AgentThinking, content=text, **common),
        st.builds(
            ToolCallEntry,
            call=st.builds(ToolCall, id=_ID, name=_NAME, arguments=text),
            **common,
        ),
        st.builds(
            ToolResultEntry,
            call_id=_ID,
            tool_name=_NAME,
            content=text,
            is_error=st.booleans(),
            elided_tokens=st.none() | st.integers(0, 10**9),
            **common,
        ),
        st.builds(
            Summary, content=text, replaced_ids=st.lists(_ID, max_size=4).map(tuple), **common
        ),
    )


_TOOLS = ("read_file", "search", "run_tests")
_ARGUMENTS = ('{"path": "a.py"}', "{}", '{"q": "x y", "n": [1, 2]}', "{")


@st.composite
def entry_lists(
    draw: st.DrawFn,
    *,
    max_units: int = 14,
    summaries: bool = True,
    pending: bool = True,
) -> list[HistoryEntry]:
    """A valid entry sequence: user messages, summaries and assistant turns with tool calls.

    Turns may leave calls unanswered (pending in the last turn, orphaned in earlier ones) and
    may reuse call ids across turns, as some servers do ("call_0" every turn).

    Args:
        draw: Supplied by hypothesis.
        max_units: The most units (user messages, summaries, assistant turns).
        summaries: Whether summaries may appear.
        pending: Whether calls may be left without a result (as a turn in flight, or one
            whose results were lost); off for histories as a finished step leaves them.
    """
    counter = itertools.count()

    def next_id() -> str:
        return f"e{next(counter)}"

    entries: list[HistoryEntry] = []
    reuse_call_ids = draw(_BOOLEANS)
    # Whether the last assistant turn has no result yet: a following turn would join it.
    open_turn = False
    kinds = _KINDS if summaries else _KINDS_WITHOUT_SUMMARIES
    for turn in range(draw(_int(0, max_units))):
        kind = draw(kinds)
        if kind == "user":
            entries.append(UserMessage(id=next_id(), content=draw(_PROSE)))
            open_turn = False
        elif kind == "summary":
            text = draw(_SHORT_PROSE)
            entries.append(Summary(id=next_id(), content=text, replaced_ids=("old1", "old2")))
            open_turn = False
        else:
            turn_entries: list[HistoryEntry] = []
            # One draw per decision group keeps generation fast on 2 cores.
            shape = draw(_int(0, 15))
            if shape & 1:
                turn_entries.append(AgentThinking(id=next_id(), content=draw(_PROSE)))
            if shape & 2:
                turn_entries.append(AgentMessage(id=next_id(), content=draw(_PROSE)))
            calls: list[ToolCallEntry] = []
            for index in range(shape >> 2):
                call_id = (
                    f"call_{index}" if reuse_call_ids and not open_turn else f"call_{turn}_{index}"
                )
                look = draw(_int(0, 11))
                calls.append(
                    ToolCallEntry(
                        id=next_id(),
                        call=ToolCall(
                            id=call_id, name=_TOOLS[look % 3], arguments=_ARGUMENTS[look // 3]
                        ),
                    )
                )
            turn_entries.extend(calls)
            unanswered = draw(_int(0, 9)) if pending else 0
            # Mostly all answered; sometimes one call, or every call, is left without a result.
            answered = [c for i, c in enumerate(calls) if unanswered not in (i + 1, 9)]
            for call in draw(st.permutations(answered)):
                outcome = draw(_int(0, 19))
                elided = outcome == 0
                turn_entries.append(
                    ToolResultEntry(
                        id=next_id(),
                        call_id=call.call_id,
                        tool_name=call.call.name,
                        content="[elided]" if elided else draw(_body()),
                        is_error=outcome >= 17,
                        elided_tokens=100 if elided else None,
                    )
                )
            if not turn_entries:
                continue
            entries.extend(turn_entries)
            open_turn = not answered
    return entries


@st.composite
def histories(
    draw: st.DrawFn,
    counter: TokenCounter | None = None,
    *,
    max_units: int = 14,
    pending: bool = True,
) -> History:
    """A `History` built from `entry_lists` (counted with `ApproxCounter` unless given).

    Args:
        draw: Supplied by hypothesis.
        counter: The history's token counter (the one your `ContextManager` will use).
        max_units: The most units.
        pending: Whether calls may be left without a result.
    """
    entries = draw(entry_lists(max_units=max_units, pending=pending))
    return History(entries, counter=counter if counter is not None else ApproxCounter())


@st.composite
def pruning_strategies(draw: st.DrawFn) -> PruningStrategy:
    """Any built-in (synchronous) strategy or a typical chain of them, with drawn parameters."""
    factories: list[Callable[[], PruningStrategy]] = [
        DropOldest,
        lambda: SlidingWindow(turns=draw(st.integers(1, 4))),
        lambda: ElideToolResults(keep_last=draw(st.integers(0, 3))),
        lambda: Chain(ElideToolResults(), DropOldest()),
        lambda: Chain(SlidingWindow(turns=draw(st.integers(1, 3))), DropOldest()),
    ]
    return draw(st.sampled_from(factories))()


@st.composite
def summarize_steps(draw: st.DrawFn) -> SummarizeOldest:
    """A `SummarizeOldest` step with an extractive summarizer, alone or between strategies.

    One in three is the ``summarize`` configuration: elide, summarize, then drop.
    """
    keep, cap = draw(st.integers(0, 4)), draw(st.integers(1, 300))
    shape = draw(st.integers(0, 2))
    return SummarizeOldest(
        ExtractiveSummarizer(counter=ApproxCounter()),
        keep_last_units=keep,
        max_summary_tokens=cap,
        before=ElideToolResults(keep_last=draw(st.integers(0, 3))) if shape == 2 else None,
        after=DropOldest() if shape >= 1 else None,
    )
