"""The kit catches the bugs it exists for: four planted bugs, each caught from fresh seeds.

Each test is the README's "Testing your own code" property with a bug planted in the user's
stand-in, run under the kit's settings profile (``"agent_flow"``, the defaults a user gets)
with no example database and several seeds. Each run must fail, and its message must name
the invariant, the step that broke it and the shrunk case. `benchmarks/bench_testing_kit.py`
runs the same properties from ten unseeded fresh starts each and prints the catch rate.

The four bug classes (issue 29, point 8): a strategy that drops a tool result but keeps its
call; one that overshoots its budget by one token, tested on its own; the same one where a
`ContextManager` would hide it; a handler that writes the wrong type into a typed extension.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.history import (
    Chain,
    DropOldest,
    ElideToolResults,
    HistoryEntry,
    PruneReport,
    PruneResult,
    ToolResultEntry,
    Unit,
    build_units,
)
from agent_flow.messages import ToolCall
from agent_flow.testing import (
    assert_handlers_apply,
    assert_render_within,
    assert_strategy_within_budget,
)
from agent_flow.testing.strategies import (
    PROFILE,
    answered_calls,
    budgets,
    budgets_around,
    context_managers,
    entry_lists,
    environments,
)
from agent_flow.tokens import ApproxCounter, TokenCounter
from agent_flow.tools import HandlerRegistry, ResultHandler, ToolResult

COUNTER = ApproxCounter()
SEEDS = (0, 1)


# -- the planted bugs ---------------------------------------------------------------------------


class DropsAResult:
    """Elides, then drops the oldest; but it "saves" more by dropping a result, not its call."""

    name = "drops_a_result"

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
        result = Chain(ElideToolResults(keep_last=0), DropOldest()).prune(
            units, max_tokens, counter
        )
        if not result.report.changed:
            return result
        kept = list(result.units)
        for index, unit in enumerate(kept):
            answer = next((e for e in unit.entries if isinstance(e, ToolResultEntry)), None)
            if answer is not None:
                kept[index] = without(unit, answer)
                break
        tokens = sum(u.tokens for u in kept)
        report = result.report.model_copy(
            update={"tokens_after": tokens, "fits": tokens <= max_tokens}
        )
        return PruneResult(tuple(kept), report)


def without(unit: Unit, answer: ToolResultEntry) -> Unit:
    """The unit without one result: its entry and its tool message (the call stays)."""
    keep = [i for i, m in enumerate(unit.messages) if m.tool_call_id != answer.call_id]
    counts = tuple(unit.message_tokens[i] for i in keep)
    return dataclasses.replace(
        unit,
        entries=tuple(e for e in unit.entries if e is not answer),
        messages=tuple(unit.messages[i] for i in keep),
        message_tokens=counts,
        tokens=sum(counts),
    )


class OffByOne:
    """Drops the oldest units while the total exceeds the budget by more than one token."""

    name = "off_by_one"

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
        kept = list(units)
        total = before = sum(u.tokens for u in units)
        dropped: list[str] = []
        index = 0
        while total > max_tokens + 1 and index < len(kept):  # the bug: `+ 1`
            if kept[index].pinned:
                index += 1
                continue
            unit = kept.pop(index)
            total -= unit.tokens
            dropped.extend(unit.ids)
        report = PruneReport(
            strategy=self.name,
            tokens_before=before,
            tokens_after=total,
            max_tokens=max_tokens,
            dropped=tuple(dropped),
            fits=total <= max_tokens,
        )
        return PruneResult(tuple(kept), report)


class Dataset(BaseModel):
    name: str
    rows: int
    columns: list[str]


def loads_rows_as_text(env: Environment, call: ToolCall, result: ToolResult) -> None:
    """A handler for ``load_csv`` that writes the row count as text (the JSON came quoted)."""
    data = result.data if isinstance(result.data, dict) else {}
    env.set_extension(
        "dataset",
        {"name": str(data.get("name", "")), "rows": str(data.get("rows", 0)), "columns": []},
    )


_CSV = st.fixed_dictionaries({"name": st.text(max_size=8), "rows": st.integers(0, 10**6)})


# -- the user's properties, as the README writes them ------------------------------------------


def strategy_property(strategy: object) -> Callable[[], None]:
    @given(data=st.data(), entries=entry_lists())
    def test(data: st.DataObject, entries: list[HistoryEntry]) -> None:
        units = build_units(entries, COUNTER)
        budget = data.draw(budgets_around(units), label="budget")
        assert_strategy_within_budget(strategy, units, budget, COUNTER)  # type: ignore[arg-type]

    return test


def manager_property(strategy: object) -> Callable[[], None]:
    @given(data=st.data(), manager=context_managers(strategy=strategy))  # type: ignore[arg-type]
    def test(data: st.DataObject, manager: ContextManager) -> None:
        units = tuple(manager.history.units())
        budget = data.draw(budgets_around(units), label="budget")
        assert_strategy_within_budget(
            manager.strategy,  # type: ignore[arg-type]
            units,
            budget,
            manager.history.counter,
        )

    return test


def handler_property(handler: ResultHandler) -> Callable[[], None]:
    @given(
        env=environments(extensions={"dataset": Dataset}),
        answered=answered_calls("load_csv", data=_CSV, errors=False),
        budget=budgets(0, 400),
    )
    def test(env: Environment, answered: tuple[ToolCall, ToolResult], budget: int) -> None:
        registry = HandlerRegistry()
        registry.register("load_csv", handler)
        assert_handlers_apply(registry, env, *answered)
        assert_render_within(env, budget, COUNTER)

    return test


def failures(make: Callable[[], Callable[[], None]]) -> list[AssertionError]:
    """Run the property from each seed, fresh, with the kit's profile; return how it failed."""
    caught = []
    for number in SEEDS:
        test = seed(number)(settings(settings.get_profile(PROFILE), database=None)(make()))
        with pytest.raises(AssertionError) as info:
            test()
        caught.append(info.value)
    return caught


def shrunk_case(error: AssertionError) -> str:
    return "\n".join(getattr(error, "__notes__", []))


# -- the four bug classes -----------------------------------------------------------------------


def test_the_kit_catches_a_strategy_that_drops_a_result_but_keeps_its_call() -> None:
    for error in failures(lambda: strategy_property(DropsAResult())):
        message = str(error)
        assert "invariant broken, whole units" in message
        assert "a tool call without its result" in message
        assert "step: drops_a_result.prune(units, max_tokens=" in message
        assert "case: budget" in message
        assert "Failing test case" in shrunk_case(error)


def test_the_kit_catches_a_strategy_that_overshoots_its_budget_by_one_token() -> None:
    for error in failures(lambda: strategy_property(OffByOne())):
        message = str(error)
        assert "invariant broken, within the budget whenever the pinned units fit" in message
        assert "1 over" in message
        assert "step: off_by_one.prune(units, max_tokens=" in message
        assert "case: budget" in message
        assert "(budget)" in shrunk_case(error)


def test_the_kit_catches_the_overshoot_a_context_manager_would_hide() -> None:
    """Through a manager the overrun never reaches a prompt: the manager prunes to a target
    below its budget, then selects what fits. Checked on its own, on the manager's own
    histories, the strategy fails.
    """
    for error in failures(lambda: manager_property(OffByOne())):
        assert "within the budget whenever the pinned units fit" in str(error)
        assert "step: off_by_one.prune" in str(error)
        assert "Failing test case" in shrunk_case(error)


def test_the_kit_catches_a_handler_that_writes_the_wrong_type_into_a_typed_extension() -> None:
    for error in failures(lambda: handler_property(loads_rows_as_text)):
        message = str(error)
        assert "invariant broken, handlers leave the environment valid" in message
        assert "loads_rows_as_text" in message
        assert "EnvironmentValidationError" in message
        assert "does not fit Dataset" in message
        assert "step: its result of call" in message
        assert "Failing test case" in shrunk_case(error)


# -- and the same properties pass on the correct stand-ins ---------------------------------------


def loads_rows(env: Environment, call: ToolCall, result: ToolResult) -> None:
    """The handler without the bug: the row count as an int."""
    data = result.data if isinstance(result.data, dict) else {}
    rows = data.get("rows", 0)
    count = rows if isinstance(rows, int) else 0
    env.set_extension("dataset", Dataset(name=str(data.get("name", "")), rows=count, columns=[]))


def test_the_same_properties_pass_on_code_without_the_bugs() -> None:
    profile = settings(settings.get_profile(PROFILE), database=None, max_examples=30)
    profile(strategy_property(Chain(ElideToolResults(keep_last=0), DropOldest())))()
    profile(manager_property(DropOldest()))()
    profile(handler_property(loads_rows))()
