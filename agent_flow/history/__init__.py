"""The conversation history: entries, units, the token-cached `History`, pruning, summarizing.

- `entries`: the entry models (`UserMessage`, `AgentMessage`, `AgentThinking`, `ToolCallEntry`,
  `ToolResultEntry`, `Summary`), their `HistoryEntry` union and its JSON form;
- `units`: the runs of entries that pruning keeps or removes whole (`Unit`, `build_units`);
- `history`: `History`, the transcript with cached token counts;
- `pruning`: the synchronous `PruningStrategy` protocol and strategies (`DropOldest`,
  `SlidingWindow`, `ElideToolResults`, `Chain`), applied with `History.prune`;
- `summarize`: the one async step, `SummarizeOldest`, which folds old units into a summary
  written by a `Summarizer`, applied with `History.fold` (or `History.summarize` for a span);
- `extractive`: `ExtractiveSummarizer`, a summarizer that needs no model.

Everything public is importable from here.
"""

from __future__ import annotations

from agent_flow.history.entries import (
    HISTORY_ENTRIES_ADAPTER,
    HISTORY_ENTRY_ADAPTER,
    AgentMessage,
    AgentThinking,
    HistoryEntry,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
    dump_entries,
    load_entries,
)
from agent_flow.history.extractive import ExtractiveSummarizer
from agent_flow.history.history import History
from agent_flow.history.pruning import (
    Chain,
    DropOldest,
    ElideToolResults,
    PruneReport,
    PruneResult,
    PruningStrategy,
    SlidingWindow,
    elision_marker,
)
from agent_flow.history.summarize import (
    DEFAULT_SUMMARY_TOKENS,
    SummarizeOldest,
    Summarizer,
)
from agent_flow.history.units import SUMMARY_PREFIX, Unit, UnitKind, build_units

__all__ = [
    "DEFAULT_SUMMARY_TOKENS",
    "HISTORY_ENTRIES_ADAPTER",
    "HISTORY_ENTRY_ADAPTER",
    "SUMMARY_PREFIX",
    "AgentMessage",
    "AgentThinking",
    "Chain",
    "DropOldest",
    "ElideToolResults",
    "ExtractiveSummarizer",
    "History",
    "HistoryEntry",
    "PruneReport",
    "PruneResult",
    "PruningStrategy",
    "SlidingWindow",
    "SummarizeOldest",
    "Summarizer",
    "Summary",
    "ToolCallEntry",
    "ToolResultEntry",
    "Unit",
    "UnitKind",
    "UserMessage",
    "build_units",
    "dump_entries",
    "elision_marker",
    "load_entries",
]
