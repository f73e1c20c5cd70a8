"""Where the environment goes in a prompt: in the system message, or a message of its own last.

With ``environment_placement="last"`` a prompt is the system template, the history, then the
environment; everything before the newest step is sent again unchanged, which is what a
provider's prompt cache needs. The budget invariants hold in both places (the testing kit's
`context_managers` draws both; these tests pin the placement).
"""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, OpenAIClient
from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import ContextBudgetError, UserError
from agent_flow.history import (
    AgentMessage,
    History,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.llm.base import NATIVE_FORMAT
from agent_flow.llm.xml_tools import XML_FORMAT
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from agent_flow.testing import assert_pinned_kept, assert_prompt_within_budget, assert_units_intact
from agent_flow.testing.strategies import context_managers, tool_sets
from agent_flow.tokens import ApproxCounter, TiktokenCounter
from tests.helpers import add
from tests.openai_server import (
    OpenAIServer,
    completion_body,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

COUNTER = ApproxCounter()
TEMPLATE = "You help.\n{task}Trust the environment.\n\n{environment}"


def _manager(
    placement: str, *, max_tokens: int = 100_000, counter: ApproxCounter | TiktokenCounter = COUNTER
) -> ContextManager:
    environment = Environment()
    environment.set("/task/objective", "Add the numbers.")
    history = History(counter=counter)
    history.add(UserMessage(content="Add the numbers."))
    return ContextManager(
        environment,
        history,
        max_tokens,
        system_prompt_template=TEMPLATE,
        environment_placement=placement,  # type: ignore[arg-type]
    )


def _step(history: History, n: int) -> None:
    call = ToolCall(id=f"call_{n}", name="add", arguments=f'{{"a": {n}, "b": 1}}')
    history.add(ToolCallEntry(call=call))
    history.add(ToolResultEntry(call_id=call.id, tool_name="add", content=str(n + 1)))


@settings(max_examples=80)
@given(
    manager=context_managers(environment_placement=st.just("last")),
    tools=tool_sets(),
    xml=st.booleans(),
)
def test_with_the_environment_last_every_prompt_fits_and_keeps_its_units(
    manager: ContextManager, tools: list[ToolDefinition], xml: bool
) -> None:
    if xml:
        manager.prompt_format = XML_FORMAT
    before = tuple(manager.history.units())
    try:
        report = asyncio.run(manager.prune_if_needed(tools=tools))
        prompt = manager.build_prompt(tools=tools)
    except ContextBudgetError:
        # Refused only when the least prompt does not fit: the template, the pinned units
        # and the tools, without the environment, as the client sends them.
        head, tail, _ = manager._template(None)
        pinned = [m for u in manager.history.units() if u.pinned for m in u.messages]
        least = [ChatMessage(role="system", content=head + tail), *pinned]
        fmt = manager.prompt_format or NATIVE_FORMAT
        wire, offered = fmt.render(least, tools)
        counted = manager.counter.count_messages(wire) + manager.counter.count_tools(offered)
        assert counted > manager.max_tokens - manager.reserve_output_tokens
        return
    assert_prompt_within_budget(prompt, manager)
    assert_units_intact(prompt)
    assert_pinned_kept(before, manager.history, report=report)
    assert_pinned_kept(manager.history, prompt)
    system, *rest = prompt.messages
    assert "{environment}" not in system.content
    environment_sent = prompt.breakdown.environment > 0
    # The environment is the last message exactly when it is sent at all.
    assert environment_sent == (bool(rest) and rest[-1].role == "system")
    if environment_sent and not xml:
        last = rest[-1]
        assert manager.counter.count_message(last) == prompt.breakdown.environment
        assert last.content.startswith("## ")


@settings(max_examples=60)
@given(
    actions=st.lists(
        st.one_of(
            st.tuples(st.just("step"), st.integers(0, 3)),
            st.tuples(st.just("write"), st.text(min_size=1, max_size=40)),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_with_the_environment_last_the_previous_prompt_is_sent_again_as_its_prefix(
    actions: list[tuple[str, object]],
) -> None:
    manager = _manager("last")
    tools = [ToolDefinition(name="add", description="Add.", parameters={"type": "object"})]
    previous = manager.build_prompt(tools=tools)
    for n, (action, value) in enumerate(actions):
        if action == "step":
            for k in range(int(str(value)) + 1):
                _step(manager.history, n * 10 + k)
        else:
            manager.environment.set("/knowledge/discovered_facts", [str(value)])
        prompt = manager.build_prompt(tools=tools)
        assert prompt.breakdown.history_units_omitted == 0
        # Everything but the environment's message is sent again, unchanged, first.
        kept = previous.messages[:-1]
        assert prompt.messages[: len(kept)] == kept
        assert prompt.messages[-1].role == "system"
        assert prompt.messages[-1].content == manager.build_prompt(tools=tools).messages[-1].content
        previous = prompt


def test_in_the_system_message_an_environment_write_changes_the_first_message() -> None:
    # Why the placement exists: every write changes what a prompt cache would match first.
    manager = _manager("system")
    first = manager.build_prompt()
    manager.environment.set("/knowledge/discovered_facts", ["a new fact"])
    second = manager.build_prompt()
    assert first.messages[0] != second.messages[0]
    assert "a new fact" in second.messages[0].content
    assert len(second.messages) == len(first.messages) == 2


def test_with_the_environment_last_the_system_message_is_the_template_alone() -> None:
    manager = _manager("last", counter=TiktokenCounter())
    prompt = manager.build_prompt()
    system, user, environment = prompt.messages
    assert system == ChatMessage(
        role="system", content="You help.\nCurrent task: Add the numbers.\nTrust the environment."
    )
    assert user.content == "Add the numbers."
    assert environment.role == "system"
    assert environment.content.startswith("## task\n")
    assert '"objective":"Add the numbers."' in environment.content
    b = prompt.breakdown
    counter = manager.counter
    assert b.system_template == counter.count_message(system)
    assert b.environment == counter.count_message(environment)
    assert counter.count_messages(list(prompt.messages)) == prompt.total_tokens  # with priming
    assert not b.environment_degraded


def test_with_the_environment_last_an_empty_environment_sends_no_message() -> None:
    history = History(counter=COUNTER)
    history.add(UserMessage(content="Hi."))
    history.add(AgentMessage(content="Hello."))
    manager = ContextManager(Environment(), history, 10_000, system_prompt_template="{environment}")
    manager.environment_placement = "last"
    rendered = manager.build_prompt()
    if rendered.breakdown.environment == 0:
        assert [m.role for m in rendered.messages] == ["system", "user", "assistant"]
    else:  # an empty environment still renders its task block
        assert rendered.messages[-1].role == "system"


def test_with_the_environment_last_a_tight_budget_shrinks_it_then_leaves_it_out() -> None:
    manager = _manager("last")
    manager.environment.set("/knowledge/discovered_facts", [f"fact {i} " * 20 for i in range(40)])
    full = manager.build_prompt()
    assert not full.breakdown.environment_degraded
    fixed = manager.fixed_tokens()
    pinned = manager.history.pinned_token_count()
    for budget in (full.total_tokens - 50, fixed + pinned + 60, fixed + pinned + 2):
        manager.max_tokens = budget + manager.reserve_output_tokens
        prompt = manager.build_prompt()
        assert_prompt_within_budget(prompt, manager)
        assert prompt.breakdown.environment_degraded
        assert prompt.breakdown.environment < full.breakdown.environment
        if prompt.breakdown.environment == 0:
            assert prompt.messages[-1].role == "user"


def test_an_unknown_placement_is_refused_with_the_choices() -> None:
    with pytest.raises(
        UserError, match=r"environment_placement must be one of \('system', 'last'\)"
    ):
        _manager("end")
    with pytest.raises(ValueError, match="environment_placement"):
        ContextConfig(environment_placement="end")  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_agent_with_the_environment_last_sends_each_prompt_as_the_next_ones_prefix(
    openai_server: OpenAIServer, stream: bool
) -> None:
    steps = 4
    for n in range(steps):
        call = [(f"call_{n}", "add", json.dumps({"a": n, "b": 1}))]
        openai_server.script(
            sse_reply(tool_call_chunks(call))
            if stream
            else json_reply(completion_body(None, tool_calls=call, finish_reason="tool_calls"))
        )
    openai_server.script(
        sse_reply(text_chunks("Done.")) if stream else json_reply(completion_body("Done."))
    )
    config = AgentConfig(
        system_prompt="You add numbers.\n{environment}",
        context=ContextConfig(max_tokens=16_000, environment_placement="last"),
    )
    async with OpenAIClient("m", base_url=openai_server.base_url, api_key="k") as llm:
        agent = AgentExecutor(llm, config=config, stream=stream)
        agent.tools.register(add)
        outcome = await agent.run("Add the numbers.")
    assert outcome.final_text == "Done."
    sent = [json.loads(r.raw_body)["messages"] for r in openai_server.requests]
    assert len(sent) == steps + 1
    for before, after in itertools.pairwise(sent):
        assert after[0] == {"role": "system", "content": "You add numbers."}
        # What a prefix cache matches: all of the previous prompt but its environment.
        assert after[: len(before) - 1] == before[:-1]
        assert len(after) == len(before) + 2  # the step's call and result
        assert after[-1]["role"] == "system" and after[-1]["content"].startswith("## task")
    # The environment the model reads last is the current one: the latest result is in it.
    assert '"call_id":"call_3"' in sent[-1][-1]["content"]
