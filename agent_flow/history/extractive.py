"""`ExtractiveSummarizer`: a `Summarizer` that writes summaries from the entries, without a model.

It turns history entries into bullet lines of who said or did what, and keeps the oldest and
newest lines when they exceed the cap. It is deterministic and offline: the summarizer for
tests, demos and runs without a model to spare (`agent_flow.llm.LLMSummarizer` asks a model).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from agent_flow._text import truncate_to_tokens
from agent_flow._unicode import json_is_clean, mend_json
from agent_flow.history.entries import (
    AgentMessage,
    AgentThinking,
    HistoryEntry,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.history.units import SUMMARY_PREFIX
from agent_flow.tokens import TokenCounter, default_counter

__all__ = ["ExtractiveSummarizer"]

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
    if not json_is_clean(parsed):  # an escape in the text made a lone surrogate
        parsed = mend_json(parsed)
    if isinstance(parsed, dict):
        parts = [
            f"{key}={_shorten(json.dumps(value, ensure_ascii=False), _VALUE_CHARS)}"
            for key, value in parsed.items()
        ]
        return _shorten(", ".join(parts), _ARGS_CHARS)
    return _shorten(json.dumps(parsed, ensure_ascii=False), _ARGS_CHARS)


def _outcome(result: ToolResultEntry) -> str:
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
            elif isinstance(entry, ToolCallEntry):
                calls[entry.call_id] = len(lines)
                call = entry.call
                lines.append(
                    f"- Agent called {call.name}({_short_arguments(call.arguments)}) → no result"
                )
            elif isinstance(entry, ToolResultEntry):
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
                return truncate_to_tokens("\n".join(lines), max_tokens, count)[0]
            if len(head) > len(tail):
                head.pop()
            else:
                tail.pop()

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(counter={self.counter.name!r})"
