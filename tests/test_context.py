from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import ContextBudgetError, UserError
from agent_flow.history import (
    AgentMessage,
    DropOldest,
    ElideToolResults,
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    SummarizeOldest,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.llm.xml_tools import XML_FORMAT, to_xml_messages
from agent_flow.messages import ToolCall, ToolDefinition
from agent_flow.testing import (
    ScriptedLLM,
    assert_pinned_kept,
    assert_prompt_within_budget,
    assert_units_intact,
)
from agent_flow.testing.strategies import entry_lists, environments, histories, tool_definitions
from agent_flow.tokens import ApproxCounter, TiktokenCounter
from tests.helpers import make_agent

COUNTER = ApproxCounter()


@settings(max_examples=150)
@given(
    env=environments(),
    history=histories(COUNTER),
    tools=st.lists(tool_definitions(), max_size=3, unique_by=lambda t: t.name),
    max_tokens=st.integers(50, 4000),
    allocation=st.floats(0.0, 1.0),
    reserve=st.integers(0, 40),
)
def test_built_prompt_never_exceeds_the_budget_when_recounted_independently(
    env: Environment,
    history: History,
    tools: list[ToolDefinition],
    max_tokens: int,
    allocation: float,
    reserve: int,
) -> None:
    manager = ContextManager(
        env,
        history,
        max_tokens,
        environment_allocation=allocation,
        counter=COUNTER,
        reserve_output_tokens=reserve,
        system_prompt_template="You help.\n{environment}",
    )
    try:
        prompt = manager.build_prompt(tools=tools)
    except ContextBudgetError as err:
        budget_error: ContextBudgetError | None = err
    else:
        budget_error = None
    if budget_error is not None:
        assert budget_error.needed > budget_error.available
        return
    recount = COUNTER.count_messages(list(prompt.messages)) + COUNTER.count_tools(tools)
    assert recount == prompt.total_tokens
    assert prompt.total_tokens <= max_tokens - reserve
    assert_prompt_within_budget(prompt, manager)
    assert_units_intact(prompt)
    # Pinned units are always sent.
    assert_pinned_kept(history, prompt)


def summarizing_step() -> SummarizeOldest:
    """The ``summarize`` configuration, with a summarizer that needs no model."""
    return SummarizeOldest(
        ExtractiveSummarizer(counter=COUNTER), before=ElideToolResults(), after=DropOldest()
    )


@settings(max_examples=60)
@given(
    env=environments(),
    history=histories(COUNTER),
    max_tokens=st.integers(200, 3000),
    summarizing=st.booleans(),
)
def test_pruning_makes_the_whole_history_fit_on_the_next_prompt(
    env: Environment, history: History, max_tokens: int, summarizing: bool
) -> None:
    manager = ContextManager(
        env,
        history,
        max_tokens,
        counter=COUNTER,
        reserve_output_tokens=10,
        strategy=summarizing_step() if summarizing else None,
    )
    try:
        budget = manager.history_budget()
    except ContextBudgetError:
        return
    pinned = sum(u.tokens for u in history.units() if u.pinned)
    report = asyncio.run(manager.prune_if_needed())
    if report is not None and pinned <= budget * manager.prune_target:
        assert history.token_count() <= budget
        prompt = manager.build_prompt()
        assert prompt.breakdown.history_units_omitted == 0


def check_xml_prompt(
    manager: ContextManager, tools: list[ToolDefinition], counter: ApproxCounter | TiktokenCounter
) -> None:
    """The prompt as XML mode sends it is what was counted, and it fits the budget."""
    try:
        prompt = manager.build_prompt(tools=tools)
    except ContextBudgetError as err:
        budget_error: ContextBudgetError | None = err
    else:
        budget_error = None
    if budget_error is not None:
        assert budget_error.needed > budget_error.available
        return
    wire = to_xml_messages(prompt.messages, prompt.tools)
    recount = counter.count_messages(wire)  # XML mode sends no native tools
    assert recount == prompt.total_tokens <= manager.max_tokens - manager.reserve_output_tokens
    assert_prompt_within_budget(prompt, manager)
    assert_units_intact(prompt)
    assert_pinned_kept(manager.history, prompt)


@settings(max_examples=150)
@given(
    env=environments(),
    history=histories(COUNTER),
    tools=st.lists(tool_definitions(), max_size=3, unique_by=lambda t: t.name),
    max_tokens=st.integers(50, 4000),
    allocation=st.floats(0.0, 1.0),
    reserve=st.integers(0, 40),
)
def test_in_xml_mode_the_prompt_as_sent_never_exceeds_the_budget(
    env: Environment,
    history: History,
    tools: list[ToolDefinition],
    max_tokens: int,
    allocation: float,
    reserve: int,
) -> None:
    manager = ContextManager(
        env,
        history,
        max_tokens,
        environment_allocation=allocation,
        reserve_output_tokens=reserve,
        system_prompt_template="You help.\n{environment}",
        prompt_format=XML_FORMAT,
    )
    check_xml_prompt(manager, tools, COUNTER)


TIKTOKEN = TiktokenCounter()


@settings(max_examples=60)
@given(
    entries=entry_lists(),
    tools=st.lists(tool_definitions(), max_size=3, unique_by=lambda t: t.name),
    max_tokens=st.integers(50, 3000),
    template=st.sampled_from(
        ["You help.\n{environment}", "{environment}", "Act.\n{environment}\n."]
    ),
)
def test_in_xml_mode_the_prompt_as_sent_fits_when_counted_by_tiktoken(
    entries: list[HistoryEntry], tools: list[ToolDefinition], max_tokens: int, template: str
) -> None:
    history = History(entries, counter=TIKTOKEN)
    manager = ContextManager(
        Environment(),
        history,
        max_tokens,
        reserve_output_tokens=0,
        system_prompt_template=template,
        prompt_format=XML_FORMAT,
    )
    check_xml_prompt(manager, tools, TIKTOKEN)


@settings(max_examples=60)
@given(
    env=environments(),
    history=histories(COUNTER),
    tools=st.lists(tool_definitions(), max_size=3, unique_by=lambda t: t.name),
    max_tokens=st.integers(200, 3000),
    summarizing=st.booleans(),
)
def test_in_xml_mode_pruning_makes_the_rendered_history_fit_on_the_next_prompt(
    env: Environment,
    history: History,
    tools: list[ToolDefinition],
    max_tokens: int,
    summarizing: bool,
) -> None:
    manager = ContextManager(
        env,
        history,
        max_tokens,
        reserve_output_tokens=10,
        strategy=summarizing_step() if summarizing else None,
        prompt_format=XML_FORMAT,
    )
    try:
        budget = manager.history_budget(tools=tools)
    except ContextBudgetError:
        return
    pinned = sum(u.tokens for u in history.units() if u.pinned)
    report = asyncio.run(manager.prune_if_needed(tools=tools))
    if report is not None and pinned <= budget * manager.prune_target:
        prompt = manager.build_prompt(tools=tools)
        assert prompt.breakdown.history_units_omitted == 0


def test_xml_mode_counts_the_tools_prompt_and_the_rewritten_tool_turns() -> None:
    tools = [
        ToolDefinition(
            name="read_file",
            description="Read a file.",
            parameters={"type": "object", "properties": {"path": {"type": "string"}}},
        )
    ]
    native = ContextManager(Environment(), long_history(20, COUNTER), 100_000, counter=COUNTER)
    xml = ContextManager(
        Environment(), long_history(20, COUNTER), 100_000, prompt_format=XML_FORMAT
    )
    sent_native = native.build_prompt(tools=tools)
    sent_xml = xml.build_prompt(tools=tools)

    wire = to_xml_messages(sent_xml.messages, tools)
    assert sent_xml.total_tokens == COUNTER.count_messages(wire)
    assert sent_xml.total_tokens > sent_native.total_tokens
    assert sent_xml.breakdown.tools > sent_native.breakdown.tools  # the rules and the JSON
    assert sent_xml.breakdown.history > sent_native.breakdown.history  # <tool> blocks


def long_history(turns: int, counter: ApproxCounter | TiktokenCounter) -> History:
    history = History(counter=counter)
    history.add(UserMessage(content="Find the bug in the parser."))
    for i in range(turns):
        history.add(AgentMessage(content=f"Reading file {i}."))
        history.add(
            ToolCallEntry(
                call=ToolCall(id=f"c{i}", name="read_file", arguments=f'{{"path": "f{i}.py"}}')
            )
        )
        history.add(ToolResultEntry(call_id=f"c{i}", tool_name="read_file", content="line\n" * 50))
    return history


def test_environment_gets_the_share_history_does_not_use() -> None:
    env = Environment()
    for i in range(300):
        env.set("/knowledge/discovered_facts/-", f"fact number {i} about the code base")
    small = History(counter=COUNTER)
    small.add(UserMessage(content="hi"))
    manager = ContextManager(
        env, small, 4000, environment_allocation=0.2, counter=COUNTER, reserve_output_tokens=0
    )
    prompt = manager.build_prompt()
    # The history needs almost nothing, so the environment may use far more than 20%.
    assert prompt.breakdown.environment > 0.2 * 4000
    assert prompt.total_tokens <= 4000


def test_history_gets_the_share_environment_does_not_use() -> None:
    history = long_history(100, COUNTER)
    manager = ContextManager(
        Environment(),
        history,
        3000,
        environment_allocation=0.9,
        counter=COUNTER,
        reserve_output_tokens=0,
    )
    prompt = manager.build_prompt()
    assert prompt.breakdown.history > 0.5 * 3000
    assert prompt.breakdown.history_units_omitted > 0
    assert prompt.total_tokens <= 3000


def test_oversized_tools_raise_a_budget_error_naming_the_tools() -> None:
    tools = [ToolDefinition(name=f"tool_{i}", description="does things " * 50) for i in range(10)]
    manager = ContextManager(
        Environment(), History(counter=COUNTER), 500, counter=COUNTER, reserve_output_tokens=0
    )
    with pytest.raises(ContextBudgetError, match="tools") as info:
        manager.build_prompt(tools=tools)
    assert info.value.part == "tools"
    assert info.value.needed > info.value.available


def test_an_oversized_first_message_raises_a_budget_error_naming_the_pinned_history() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="word " * 2000))
    manager = ContextManager(Environment(), history, 1000, counter=COUNTER, reserve_output_tokens=0)
    with pytest.raises(ContextBudgetError, match="pinned history") as info:
        manager.build_prompt()
    assert info.value.part == "pinned_history"


def test_invalid_settings_are_rejected_early() -> None:
    env, history = Environment(), History(counter=COUNTER)
    with pytest.raises(UserError, match="environment_allocation"):
        ContextManager(env, history, 1000, environment_allocation=1.5)
    with pytest.raises(UserError, match="reserve_output_tokens"):
        ContextManager(env, history, 1000, reserve_output_tokens=1000)
    with pytest.raises(UserError, match="max_tokens"):
        ContextManager(env, history, 0)


def test_prompt_counts_match_tiktoken_exactly() -> None:
    counter = TiktokenCounter()
    env = Environment()
    env.set("/task/objective", "Fix the parser")
    history = long_history(20, counter)
    tools = [
        ToolDefinition(
            name="read_file",
            description="Read a file.",
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        )
    ]
    manager = ContextManager(
        env,
        history,
        2000,
        counter=counter,
        reserve_output_tokens=100,
        system_prompt_template="{task}Help.\n{environment}",
    )
    prompt = manager.build_prompt("Fix the parser", tools=tools)
    assert prompt.total_tokens == counter.count_messages(list(prompt.messages)) + (
        counter.count_tools(tools)
    )
    assert prompt.total_tokens <= 1900
    assert "Current task: Fix the parser" in prompt.messages[0].content
    assert prompt.messages[1].content == "Find the bug in the parser."


async def test_prune_if_needed_prunes_below_target_and_reports() -> None:
    history = long_history(60, COUNTER)
    manager = ContextManager(Environment(), history, 2000, counter=COUNTER, reserve_output_tokens=0)
    before = history.token_count()
    report = await manager.prune_if_needed()
    assert report is not None
    assert report.tokens_before == before
    assert history.token_count() <= int(manager.history_budget() * manager.prune_target)
    assert await manager.prune_if_needed() is None


async def test_prune_if_needed_awaits_a_summarizing_step_and_reports_its_summary() -> None:
    history = long_history(60, COUNTER)
    manager = ContextManager(
        Environment(),
        history,
        2000,
        counter=COUNTER,
        reserve_output_tokens=0,
        strategy=summarizing_step(),
    )
    report = await manager.prune_if_needed()
    assert report is not None
    assert report.strategy == "chain(elide_tool_results, summarize_oldest, drop_oldest)"
    assert [s.strategy for s in report.steps][:2] == ["elide_tool_results", "summarize_oldest"]
    (summary,) = [e for e in history.entries if isinstance(e, Summary)]
    assert summary.id == report.summary_id
    assert history.token_count() <= int(manager.history_budget() * manager.prune_target)
    assert await manager.prune_if_needed() is None


# -- the task line and the fixed costs --------------------------------------------------------


def _with_objective(objective: str) -> ContextManager:
    env = Environment()
    env.update_section("task", objective=objective)
    return ContextManager(env, History(counter=COUNTER), 8000, counter=COUNTER)


def test_the_task_line_names_the_environments_objective_unless_the_caller_names_another() -> None:
    manager = _with_objective("Fix the CSV parser")
    system = manager.build_prompt().messages[0].content
    assert system.splitlines()[1] == "Current task: Fix the CSV parser"
    other = manager.build_prompt("Write the tests").messages[0].content
    assert other.splitlines()[1] == "Current task: Write the tests"
    assert "Current task" not in manager.build_prompt("").messages[0].content
    assert "Current task" not in _with_objective("").build_prompt().messages[0].content


def test_a_long_objective_becomes_one_shortened_task_line() -> None:
    manager = _with_objective("Fix\n\nthe   parser:\n" + "traceback line\n" * 200)
    line = manager.build_prompt().messages[0].content.splitlines()[1]
    assert line.startswith("Current task: Fix the parser: traceback line traceback line")
    assert line.endswith(" …")
    assert len(line) <= len("Current task: ") + 300


@given(objective=st.text(max_size=600), tools=st.lists(tool_definitions(), max_size=3))
def test_fixed_tokens_are_what_every_prompt_pays_before_environment_and_history(
    objective: str, tools: list[ToolDefinition]
) -> None:
    manager = _with_objective(objective)
    manager.history.add(UserMessage(content="hello"))
    try:
        prompt = manager.build_prompt(tools=tools)
    except ContextBudgetError:
        return
    parts = prompt.breakdown
    assert manager.fixed_tokens(tools=tools) == parts.system_template + parts.tools + parts.priming
    assert parts.total == manager.fixed_tokens(tools=tools) + parts.environment + parts.history


async def test_the_agent_names_its_task_in_the_system_prompt_it_sends() -> None:
    llm = ScriptedLLM(["Done."])
    agent = make_agent(llm)
    await agent.run("Fix the CSV parser")
    assert "\nCurrent task: Fix the CSV parser\n" in llm.requests[0].messages[0].content
