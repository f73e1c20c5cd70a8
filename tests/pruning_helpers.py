"""Pruning calls, strategies and unit measures shared by the pruning tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hypothesis import strategies as st

from agent_flow.history import (
    AgentMessage,
    Chain,
    DropOldest,
    History,
    HistoryEntry,
    PruneResult,
    PruningStrategy,
    SummarizeOldest,
    Unit,
    UserMessage,
)
from agent_flow.testing.strategies import (
    pruning_strategies,
    summarize_steps,
)
from agent_flow.tokens import ApproxCounter
from tests.test_history import turn

COUNTER = ApproxCounter()


def prune(
    strategy: PruningStrategy | SummarizeOldest, units: Sequence[Unit], budget: int
) -> PruneResult:
    """Apply a sync strategy directly, or run a summarizing step to completion."""
    if isinstance(strategy, SummarizeOldest):
        return asyncio.run(strategy.fold(tuple(units), budget, COUNTER))
    return strategy.prune(tuple(units), budget, COUNTER)


def pruners() -> st.SearchStrategy[PruningStrategy | SummarizeOldest]:
    """Any sync strategy, or a summarizing step (alone or with strategies around it)."""
    return st.one_of(pruning_strategies(), summarize_steps())


def total(units: Sequence[Unit]) -> int:
    return sum(u.tokens for u in units)


def ids(units: Sequence[Unit]) -> list[str]:
    return [e.id for u in units for e in u.entries]


def ends_with_drop_oldest(strategy: PruningStrategy | SummarizeOldest | None) -> bool:
    if isinstance(strategy, Chain):
        return isinstance(strategy.strategies[-1], DropOldest)
    if isinstance(strategy, SummarizeOldest):
        return ends_with_drop_oldest(strategy.after)
    return isinstance(strategy, DropOldest)


def conversation(turns: int, body: str = "line of output " * 40) -> History:
    history = History(counter=COUNTER)
    for i in range(turns):
        history.add(UserMessage(content=f"Request {i}."))
        turn(history, f"c{i}", body)
        history.add(AgentMessage(content=f"Answer {i}."))
    return history


class FixedSummarizer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.calls: list[tuple[list[str], int]] = []

    async def summarize(self, entries: Sequence[HistoryEntry], *, max_tokens: int) -> str:
        self.calls.append(([e.id for e in entries], max_tokens))
        return self.text
