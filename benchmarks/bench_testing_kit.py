"""Does the testing kit catch the bugs it exists for? Catch rates from fresh runs, with timings.

For each of the four planted bugs of ``tests/test_testing_planted.py`` (a strategy that drops a
tool result but keeps its call; one that overshoots its budget by one token, tested alone and
through a `ContextManager`; a handler that writes the wrong type into a typed extension), the
user's property runs ``--runs`` times from fresh, unseeded starts with the kit's settings
profile (``"agent_flow"``) and no example database, as a user's first run would. Each row
prints how many runs caught the bug and the slowest run (search and shrinking).

The baseline, measured in the same run: the same bugs under the README's properties as they
were before issue 29 (uniform budgets, the report's ``fits`` compared by hand, the manager's
prompt checks, ``registry.apply(...).errors == []`` on environments without registered
models). Then the first draw of text in a fresh checkout (a fresh hypothesis storage
directory), full unicode against the kit's alphabet: the time the ``too_slow`` health check
counts against the first examples.

Usage: python benchmarks/bench_testing_kit.py [--runs 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import ContextBudgetError
from agent_flow.history import HistoryEntry, Unit, build_units
from agent_flow.messages import ToolCall, ToolDefinition
from agent_flow.testing import assert_prompt_within_budget, assert_units_intact
from agent_flow.testing.strategies import (
    PROFILE,
    answered_calls,
    budgets,
    context_managers,
    entry_lists,
    environments,
    extension_values,
    tool_sets,
)
from agent_flow.tools import HandlerRegistry, ToolResult
from tests.test_testing_planted import (
    _CSV,
    COUNTER,
    Dataset,
    DropsAResult,
    OffByOne,
    handler_property,
    loads_rows_as_text,
    manager_property,
    strategy_property,
)


def uniform_budgets(units: Sequence[Unit]) -> st.SearchStrategy[int]:
    """`budgets_around` before issue 29: no budget drawn on purpose at an edge."""
    everything = sum(u.tokens for u in units)
    pinned = sum(u.tokens for u in units if u.pinned)
    return st.one_of(
        st.floats(0.0, 1.2).map(lambda f: int(everything * f)),
        st.floats(0.0, 1.0).map(lambda f: pinned + int((everything - pinned) * f)),
    )


def old_strategy_property(strategy: object) -> Callable[[], None]:
    @given(data=st.data(), entries=entry_lists())
    def test(data: st.DataObject, entries: list[HistoryEntry]) -> None:
        units = build_units(entries, COUNTER)
        budget = data.draw(uniform_budgets(units), label="budget")
        result = strategy.prune(units, budget, COUNTER)  # type: ignore[attr-defined]
        assert_units_intact(result)
        assert result.report.fits == (sum(u.tokens for u in result.units) <= budget)

    return test


def old_manager_property(strategy: object) -> Callable[[], None]:
    @given(manager=context_managers(strategy=strategy), tools=tool_sets())  # type: ignore[arg-type]
    def test(manager: ContextManager, tools: list[ToolDefinition]) -> None:
        try:
            asyncio.run(manager.prune_if_needed(tools=tools))
            prompt = manager.build_prompt(tools=tools)
        except ContextBudgetError:
            return
        assert_prompt_within_budget(prompt, manager)
        assert_units_intact(prompt)

    return test


def old_handler_property() -> Callable[[], None]:
    # A strategy of values, as the README's environments(extensions=...) drew them: no model.
    unregistered = {"dataset": extension_values(Dataset)}

    @given(
        env=environments(extensions=unregistered),
        answered=answered_calls("load_csv", data=_CSV, errors=False),
        budget=budgets(0, 400),
    )
    def test(env: Environment, answered: tuple[ToolCall, ToolResult], budget: int) -> None:
        registry = HandlerRegistry()
        registry.register("load_csv", loads_rows_as_text)
        assert registry.apply(env, *answered).errors == []

    return test


def catch_rate(make: Callable[[], Callable[[], None]], runs: int) -> tuple[int, float]:
    caught, slowest = 0, 0.0
    for _ in range(runs):
        test = settings(settings.get_profile(PROFILE), database=None)(make())
        started = time.perf_counter()
        try:
            test()
        except AssertionError:
            caught += 1
        slowest = max(slowest, time.perf_counter() - started)
    return caught, slowest


_FIRST_DRAW = """
import time
from hypothesis import HealthCheck, given, settings, strategies as st
from agent_flow.testing.strategies import texts
chosen = {strategy}
seconds = []
@settings(max_examples=1, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def first(data):
    started = time.perf_counter()
    data.draw(chosen)
    seconds.append(time.perf_counter() - started)
first()
print(seconds[0])
"""


def first_draw_seconds(strategy: str) -> float:
    with tempfile.TemporaryDirectory() as storage:
        env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": storage}
        done = subprocess.run(
            [sys.executable, "-c", _FIRST_DRAW.format(strategy=strategy)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh runs per bug class")
    runs = parser.parse_args().runs
    settings.register_profile("bench", suppress_health_check=list(HealthCheck))
    cases = [
        (
            "drops a tool result, keeps its call",
            lambda: strategy_property(DropsAResult()),
            lambda: old_strategy_property(DropsAResult()),
        ),
        (
            "overshoots its budget by one token",
            lambda: strategy_property(OffByOne()),
            lambda: old_strategy_property(OffByOne()),
        ),
        (
            "the same, through a ContextManager",
            lambda: manager_property(OffByOne()),
            lambda: old_manager_property(OffByOne()),
        ),
        (
            "handler writes the wrong type",
            lambda: handler_property(loads_rows_as_text),
            old_handler_property,
        ),
    ]
    print(f"{'planted bug':<38} {'kit now':>9} {'slowest':>9}   {'before':>9} {'slowest':>9}")
    for name, now, before in cases:
        caught, slowest = catch_rate(now, runs)
        old_caught, old_slowest = catch_rate(before, runs)
        print(
            f"{name:<38} {caught:>4}/{runs:<4} {slowest:>8.1f}s   "
            f"{old_caught:>4}/{runs:<4} {old_slowest:>8.1f}s"
        )
    print()
    print("first text draw in a fresh checkout (hypothesis builds its unicode tables):")
    for label, strategy in (
        ("st.text() (full unicode, before)", "st.text(max_size=20)"),
        ("texts() (the kit's alphabet)", "texts(max_size=20)"),
    ):
        print(f"  {label:<36} {first_draw_seconds(strategy):6.2f}s")
    print("  (HealthCheck.too_slow fails a test whose first 10 draws take over 1 s in all)")


if __name__ == "__main__":
    main()
