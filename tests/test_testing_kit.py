"""The property-testing kit: its strategies draw what they promise, its checkers catch breakage.

The project's own suite tests the library with this kit (test_pruning, test_context,
test_history, test_environment, ...); here the kit itself is checked: every checker fails on
the breakage it names, the strategies honour their options and shrink to small examples, and
the scripted models stay importable without hypothesis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Sequence

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import ContextBudgetError
from agent_flow.history import (
    AgentMessage,
    DropOldest,
    History,
    HistoryEntry,
    PruneResult,
    ToolCallEntry,
    ToolResultEntry,
    Unit,
    UserMessage,
    build_units,
)
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from agent_flow.testing import (
    assert_pinned_kept,
    assert_prompt_within_budget,
    assert_render_within,
    assert_units_intact,
)
from agent_flow.testing.strategies import (
    answered_calls,
    budget_edges,
    budgets_around,
    context_managers,
    entry_lists,
    environments,
    histories,
    tool_sets,
)
from agent_flow.tokens import ApproxCounter, TokenCounter
from agent_flow.tools import ToolResult

COUNTER = ApproxCounter()


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_scripted_models_and_checkers_import_without_hypothesis() -> None:
    done = run_python(
        "import sys; sys.modules['hypothesis'] = None\n"
        "import agent_flow.testing as t\n"
        "assert t.ScriptedLLM and t.assert_units_intact\n"
        "print('ok')"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_strategies_without_hypothesis_say_what_to_install() -> None:
    done = run_python(
        "import sys; sys.modules['hypothesis'] = None\nimport agent_flow.testing.strategies"
    )
    assert done.returncode != 0
    assert "pip install 'agent-flow[testing]'" in done.stderr


# -- assert_units_intact ---------------------------------------------------------------------


def assistant(*call_ids: str) -> ChatMessage:
    calls = tuple(ToolCall(id=i, name="search", arguments="{}") for i in call_ids)
    return ChatMessage(role="assistant", content="", tool_calls=calls)


def tool(call_id: str) -> ChatMessage:
    return ChatMessage(role="tool", content="ok", tool_call_id=call_id)


USER = ChatMessage(role="user", content="go")


def test_units_intact_passes_answered_and_parallel_calls() -> None:
    assert_units_intact([USER, assistant("a", "b"), tool("b"), tool("a"), assistant()])


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([USER, assistant("a", "b"), tool("a")], r"\['b'\] of message 1 are never answered"),
        ([USER, assistant("a"), USER, tool("a")], r"\['a'\] of message 1 are not answered"),
        ([USER, tool("a")], "result of call 'a'"),
        ([USER, assistant("a"), tool("a"), tool("a")], "result of call 'a'"),
        ([USER, assistant("a", "a"), tool("a")], "repeats a call id"),
    ],
)
def test_units_intact_names_the_call_a_strict_provider_would_refuse(
    messages: list[ChatMessage], says: str
) -> None:
    with pytest.raises(AssertionError, match=says):
        assert_units_intact(messages)


def test_units_intact_finds_a_result_moved_into_another_unit() -> None:
    call = ToolCallEntry(id="c", call=ToolCall(id="x", name="search", arguments="{}"))
    result = ToolResultEntry(id="r", call_id="x", tool_name="search", content="ok")
    (first,) = build_units([UserMessage(id="u", content="go"), call, result], COUNTER)[1:]
    # A strategy that rebuilt the turn without its call keeps the result alone.
    broken = dataclasses.replace(first, entries=(result,))
    with pytest.raises(AssertionError, match="not a call of that unit"):
        assert_units_intact([broken])


# -- assert_pinned_kept ----------------------------------------------------------------------


class DropsTheTask:
    """A broken strategy: it drops the first unit, pinned or not."""

    name = "drops_the_task"

    def prune(self, units: Sequence[Unit], max_tokens: int, counter: TokenCounter) -> PruneResult:
        result = DropOldest().prune(units, max_tokens, counter)
        return PruneResult(tuple(units[1:]), result.report)


@settings(max_examples=40)
@given(entries=entry_lists())
def test_pinned_kept_catches_a_strategy_that_drops_the_task(entries: list[HistoryEntry]) -> None:
    units = build_units(entries, COUNTER)
    result = DropsTheTask().prune(units, 0, COUNTER)
    if units and units[0].pinned:
        with pytest.raises(AssertionError, match="was dropped"):
            assert_pinned_kept(units, result)
    else:
        assert_pinned_kept(units, result)


def test_pinned_kept_catches_a_prompt_without_the_task() -> None:
    history = History([UserMessage(id="u", content="Fix the parser.")], counter=COUNTER)
    manager = ContextManager(Environment(), history, 2000, counter=COUNTER)
    prompt = manager.build_prompt()
    assert_pinned_kept(history, prompt)
    without = dataclasses.replace(prompt, messages=prompt.messages[:1])
    with pytest.raises(AssertionError, match="Fix the parser"):
        assert_pinned_kept(history, without)


def test_pinned_kept_catches_a_changed_task() -> None:
    units = build_units([UserMessage(id="u", content="Fix the parser.")], COUNTER)
    changed = build_units([UserMessage(id="u", content="Fix it.")], COUNTER)
    with pytest.raises(AssertionError, match="'u' was changed"):
        assert_pinned_kept(units, changed)


# -- assert_prompt_within_budget -------------------------------------------------------------


def small_manager(max_tokens: int = 400) -> ContextManager:
    history = History(
        [UserMessage(id="u", content="Fix the parser."), AgentMessage(id="a", content="On it.")],
        counter=COUNTER,
    )
    return ContextManager(Environment(), history, max_tokens, counter=COUNTER)


def test_prompt_within_budget_catches_a_prompt_that_misstates_its_size() -> None:
    manager = small_manager()
    prompt = manager.build_prompt()
    assert_prompt_within_budget(prompt, manager)
    with pytest.raises(AssertionError, match="off by 1"):
        assert_prompt_within_budget(
            dataclasses.replace(prompt, total_tokens=prompt.total_tokens - 1), manager
        )


def test_prompt_within_budget_catches_a_prompt_over_the_budget() -> None:
    prompt = small_manager(2000).build_prompt()
    tight = small_manager(prompt.total_tokens + 5)
    tight.reserve_output_tokens = 10
    with pytest.raises(AssertionError, match="context_length_exceeded"):
        assert_prompt_within_budget(prompt, tight)


# -- assert_render_within --------------------------------------------------------------------


class Overflowing(Environment):
    """A broken renderer: it ignores its budget."""

    def render(self, max_tokens: int, counter: TokenCounter) -> str:
        return super().render(1 << 40, counter)


def test_render_within_catches_a_rendering_over_budget() -> None:
    env = Overflowing()
    env.set("/knowledge/discovered_facts/-", "the parser splits on ',' " * 20)
    assert_render_within(Environment.from_json(env.to_json()), 10, COUNTER)
    with pytest.raises(AssertionError, match="over its budget of 10"):
        assert_render_within(env, 10, COUNTER)


# -- the strategies --------------------------------------------------------------------------


class Dataset(BaseModel):
    name: str
    rows: int
    columns: list[str]


@settings(max_examples=40)
@given(env=environments(extensions={"dataset": Dataset}, writes=6))
def test_environments_always_hold_the_users_own_extension_valid(env: Environment) -> None:
    assert isinstance(env.get_extension("dataset", Dataset), Dataset)


@settings(max_examples=40)
@given(env=environments(free_extensions=False))
def test_environments_without_free_extensions_hold_only_pointer_writes(env: Environment) -> None:
    extensions = env.get("/extensions")
    assert isinstance(extensions, dict)
    written = {c.pointer.split("/")[2] for c in env.changes() if c.pointer.startswith("/ext")}
    assert set(extensions) <= {k.replace("~1", "/").replace("~0", "~") for k in written}


@settings(max_examples=40)
@given(answered=answered_calls("search"))
def test_answered_calls_answer_their_own_call(answered: tuple[ToolCall, ToolResult]) -> None:
    call, result = answered
    assert result.call_id == call.id
    assert result.tool_name == call.name == "search"


@settings(max_examples=40)
@given(history=histories(pending=False))
def test_histories_without_pending_calls_answer_every_call(history: History) -> None:
    assert history.pending_calls() == []
    assert_units_intact(history)


@settings(max_examples=60)
@given(manager=context_managers(), tools=tool_sets())
def test_every_drawn_setup_builds_prompts_that_pass_every_check(
    manager: ContextManager, tools: list[ToolDefinition]
) -> None:
    before = tuple(manager.history.units())
    try:
        report = asyncio.run(manager.prune_if_needed(tools=tools))
        prompt = manager.build_prompt(tools=tools)
    except ContextBudgetError:
        return
    assert_prompt_within_budget(prompt, manager)
    assert_units_intact(prompt)
    assert_pinned_kept(before, manager.history, report=report)
    assert_pinned_kept(manager.history, prompt)


@settings(max_examples=40)
@given(data=st.data(), entries=entry_lists())
def test_budgets_around_stay_within_reach_of_the_units(
    data: st.DataObject, entries: list[HistoryEntry]
) -> None:
    units = build_units(entries, COUNTER)
    budget = data.draw(budgets_around(units))
    total = sum(u.tokens for u in units)
    assert 0 <= budget <= max(int(total * 1.2), total + 1)


@settings(max_examples=40)
@given(entries=entry_lists())
def test_budget_edges_surround_every_size_dropping_the_oldest_keeps(
    entries: list[HistoryEntry],
) -> None:
    units = build_units(entries, COUNTER)
    edges = set(budget_edges(units))
    pinned = [u for u in units if u.pinned]
    others = [u for u in units if not u.pinned]
    for kept in range(len(others) + 1):
        size = sum(u.tokens for u in pinned) + sum(u.tokens for u in others[len(others) - kept :])
        assert {max(0, size - 1), size, size + 1} <= edges


def test_budgets_around_draws_budgets_one_token_below_a_kept_size_on_purpose() -> None:
    """Where an off-by-one strategy fails: each such budget is drawn, not left to luck."""
    entries: list[HistoryEntry] = [
        UserMessage(id="u", content="Fix the parser in src/parser.py."),
        AgentMessage(id="a1", content="Reading it. " * 30),
        UserMessage(id="u2", content="And the tests too, please."),
        AgentMessage(id="a2", content="Done: " + "the tests pass. " * 20),
    ]
    units = build_units(entries, COUNTER)
    pinned = units[0].tokens
    below = {pinned + sum(u.tokens for u in units[k:]) - 1 for k in (1, 2, 3)}
    drawn: list[int] = []

    @settings(max_examples=100, derandomize=True, database=None)
    @given(budget=budgets_around(units))
    def draw(budget: int) -> None:
        drawn.append(budget)

    draw()
    assert below <= set(drawn)


def test_a_failing_history_shrinks_to_a_small_readable_one() -> None:
    # The smallest history with an answered call and a later user message.
    def answered_then_user(history: History) -> bool:
        kinds = [e.kind for e in history.entries]
        return "tool_result" in kinds and kinds[-1] == "user_message"

    once = settings(max_examples=2000, derandomize=True, database=None)
    smallest = find(histories(), answered_then_user, settings=once)
    kinds = [e.kind for e in smallest.entries]
    # At best the call, its result and the message; never much more than that.
    assert kinds[-1] == "user_message" and len(kinds) <= 4
    assert all(len(getattr(e, "content", "")) <= 10 for e in smallest.entries)
