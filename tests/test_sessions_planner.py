"""The store's append planner (sessions/_planner.py) under pruning strategies that surprise it.

A strategy may return any valid history: shorter, longer, rewritten, reordered. Whatever it
returns, what a store saves must read back as the history in memory.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import Environment
from agent_flow.history import (
    AgentMessage,
    History,
    HistoryEntry,
    PruneReport,
    PruneResult,
    Summary,
    Unit,
    UserMessage,
    build_units,
)
from agent_flow.llm.base import LLMRequest
from agent_flow.sessions import InMemorySessionStore, SQLiteSessionStore
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.testing.strategies import entry_lists
from agent_flow.tokens import ApproxCounter, TokenCounter
from tests.helpers import unit_groups

COUNTER = ApproxCounter()


class Rewriter:
    """A pruning strategy that returns what it was told: valid units, arbitrary shape."""

    name = "rewriter"

    def __init__(self, make: Any) -> None:
        self.make = make

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
        kept = tuple(self.make(tuple(units), counter))
        tokens = sum(u.tokens for u in kept)
        left = {e.id for u in kept for e in u.entries}
        return PruneResult(
            units=kept,
            report=PruneReport(
                strategy=self.name,
                tokens_before=sum(u.tokens for u in units),
                tokens_after=tokens,
                max_tokens=max_tokens,
                dropped=tuple(e.id for u in units for e in u.entries if e.id not in left),
                fits=tokens <= max_tokens,
            ),
        )


_fresh_ids = (f"new{i}" for i in itertools.count())


def _fresh_user(counter: TokenCounter) -> Unit:
    (unit,) = build_units([UserMessage(id=next(_fresh_ids), content="added")], counter)
    return unit


def _rewritten(unit: Unit, counter: TokenCounter) -> Unit:
    """The same unit with its first entry replaced by a different one (a new id)."""
    first = unit.entries[0]
    changed = first.model_copy(update={"id": next(_fresh_ids)})
    if isinstance(first, UserMessage | AgentMessage | Summary):
        changed = first.model_copy(update={"id": next(_fresh_ids), "content": "rewritten"})
    (rebuilt,) = build_units([changed, *unit.entries[1:]], counter)
    return rebuilt


async def test_a_pruning_that_rewrites_an_old_entry_and_lengthens_the_history_is_saved() -> None:
    """sessions/_planner.py `_kept_entries`: the "only grew" shortcut trusted the version
    arithmetic (one more version per added entry) and the last saved entry still being in
    place. A pruning that rewrites an early entry and adds one unit satisfies both, so the
    rewritten entry was never stored.
    """
    store = InMemorySessionStore()
    history, environment = History(counter=COUNTER), Environment()
    info = await store.create()
    for i in range(4):
        history.add(UserMessage(content=f"message {i}"))
    await store.save_step(info.id, history=history, environment=environment)
    history.add(UserMessage(content="message 4"))

    def rewrite_second_and_append(units: tuple[Unit, ...], counter: TokenCounter) -> list[Unit]:
        return [units[0], _rewritten(units[1], counter), *units[2:], _fresh_user(counter)]

    history.prune(Rewriter(rewrite_second_and_append), 10**6)
    await store.save_step(info.id, history=history, environment=environment)
    assert (await store.load(info.id)).entries == tuple(history.entries)


@st.composite
def surprising_strategies(draw: st.DrawFn) -> Rewriter:
    """A strategy that keeps, drops, rewrites, reorders and inserts units, as drawn.

    Whatever it returns is valid for `History` (whole units, each entry once), which is all the
    store may assume; the pinned first user message may be moved or rewritten too.
    """
    seed = draw(st.integers(0, 2**32 - 1))
    reorder = draw(st.booleans())

    def make(units: tuple[Unit, ...], counter: TokenCounter) -> list[Unit]:
        out: list[Unit] = []
        for index, unit in enumerate(units):
            action = (seed >> (2 * (index % 16))) & 3
            if action == 1 and len(units) > 1:
                continue  # drop it
            if action == 2:
                out.append(_rewritten(unit, counter))
            else:
                out.append(unit)
            if action == 3:
                out.append(_fresh_user(counter))
        if reorder and len(out) > 1:
            out = out[1:] + out[:1]
        return out

    return Rewriter(make)


@settings(max_examples=40)
@given(
    entries=entry_lists(max_units=12, pending=False),
    cuts=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    strategies=st.lists(st.none() | surprising_strategies(), min_size=7, max_size=7),
)
def test_whatever_a_strategy_returns_the_store_reads_back_the_history(
    entries: list[HistoryEntry],
    cuts: list[int],
    strategies: list[Rewriter | None],
) -> None:
    async def scenario(path: Path) -> None:
        history, environment = History(counter=COUNTER), Environment()
        # The writer never reads (a load would reset what it remembers of the session); a
        # second store object on the same file reads what was really written.
        async with (
            SQLiteSessionStore(path, synchronous="normal") as writer,
            SQLiteSessionStore(path, synchronous="normal") as reader,
            InMemorySessionStore() as memory,
        ):
            info = await writer.create(session_id="s")
            await memory.create(session_id="s")
            for step, group in enumerate(unit_groups(entries, cuts, COUNTER)):
                history.extend(group)
                strategy = strategies[step % len(strategies)]
                if strategy is not None:
                    history.prune(strategy, 10**6)
                await writer.save_step(info.id, history=history, environment=environment)
                await memory.save_step(info.id, history=history, environment=environment)
                assert (await reader.load(info.id)).entries == tuple(history.entries)
            assert (await memory.load(info.id)).entries == tuple(history.entries)

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(scenario(Path(folder) / "sessions.db"))


async def test_an_agent_whose_strategy_rewrites_and_lengthens_the_history_stores_it_exactly() -> (
    None
):
    """The same, through the agent loop: prune after every step, then save that step."""
    store = InMemorySessionStore()
    turns = 0

    def model(request: LLMRequest) -> Reply:
        nonlocal turns
        turns += 1
        if turns > 6:
            return "done"
        return reply(
            "working " * 150,
            tool_calls=[call("update_plan", steps=[{"description": f"step {turns}"}])],
        )

    def rewrite_and_add(units: tuple[Unit, ...], counter: TokenCounter) -> list[Unit]:
        rest = [_rewritten(units[1], counter), *units[2:]] if len(units) > 2 else list(units[1:])
        return [units[0], *rest, _fresh_user(counter)]

    config = AgentConfig(
        context=ContextConfig(max_tokens=1500, reserve_output_tokens=200, counter="approx")
    )
    agent = AgentExecutor(FunctionLLM(model), config=config, store=store)
    agent.context.strategy = Rewriter(rewrite_and_add)
    outcome = await agent.run("go")
    assert outcome.stop_reason is StopReason.ANSWERED
    assert agent.session_id is not None
    assert any(e.kind == "history_pruned" for e in await store.events(agent.session_id))
    state = await store.load(agent.session_id)
    assert state.entries == tuple(agent.history.entries)
