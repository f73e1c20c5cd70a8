"""Edge cases of the agent loop, the context budget, the event bus and config loading.

Each test began as a review finding that failed on the code as first written; those whose
docstring says "PINS" pinned behaviour that was in doubt. Hangs are bounded with
``asyncio.timeout`` so a regression shows up as a failure, never a stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.config import AgentConfig, ContextConfig, Skill, load_config
from agent_flow.context import ContextManager
from agent_flow.environment import Environment
from agent_flow.errors import (
    ConfigError,
    ContextBudgetError,
    ModelConnectionError,
    UserError,
)
from agent_flow.events import AgentEvent, EventBus, WarningRaised
from agent_flow.history import History, UserMessage
from agent_flow.llm.base import LLMRequest
from agent_flow.sessions import SQLiteSessionStore
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM, call, fail, reply
from agent_flow.testing.strategies import environments, histories
from agent_flow.tokens import ApproxCounter, TiktokenCounter
from agent_flow.tools import ToolExecutor, tool
from tests.helpers import add, assert_history_consistent, make_agent


def warning(seq: int) -> WarningRaised:
    return WarningRaised(run_id="r", seq=seq, message=f"w{seq}")


# -- context.py ------------------------------------------------------------------------------


async def test_activating_a_skill_after_a_first_run_changes_the_system_prompt() -> None:
    """context.py `_template` caches by `current_task` only, so a new template is ignored."""
    skill = Skill(name="math", system_prompt="You only do math.", allowed_tools=("add",))
    llm = ScriptedLLM(["first answer", "second answer"])
    agent = make_agent(llm, skills=(skill,))
    await agent.run("hello")
    agent.activate_skill("math")
    await agent.send("now math")
    assert llm.requests[1].messages[0].content.startswith("You only do math.")


def test_changing_the_system_prompt_template_changes_the_next_prompt() -> None:
    """Same root cause, at the ContextManager level (the attribute is public)."""
    counter = ApproxCounter()
    manager = ContextManager(Environment(), History(counter=counter), 4000, counter=counter)
    manager.build_prompt()
    manager.system_prompt_template = "NEW PROMPT {environment}"
    assert manager.build_prompt().messages[0].content.startswith("NEW PROMPT")


EXACT = TiktokenCounter()


@settings(max_examples=120)
@given(
    env=environments(),
    history=histories(EXACT),
    head=st.sampled_from(["", "x", "You help:", "a=", "##"]),
    tail=st.sampled_from(["", "y", "\n.", "==", "}"]),
    task=st.one_of(st.none(), st.text(max_size=30)),
    max_tokens=st.integers(60, 3000),
    allocation=st.floats(0.0, 1.0),
)
def test_built_prompt_fits_with_the_exact_counter_and_tight_template_seams(
    env: Environment,
    history: History,
    head: str,
    tail: str,
    task: str | None,
    max_tokens: int,
    allocation: float,
) -> None:
    """PINS (passes): the budget invariant with tiktoken, where tokens merge across the
    seams of template and environment, and with a ``{task}`` line (the repo's property test
    uses only ApproxCounter and one template).
    """
    manager = ContextManager(
        env,
        history,
        max_tokens,
        environment_allocation=allocation,
        counter=EXACT,
        reserve_output_tokens=10,
        system_prompt_template=f"{head}{{task}}{{environment}}{tail}",
    )
    try:
        prompt = manager.build_prompt(task)
    except ContextBudgetError:
        return
    recount = EXACT.count_messages(list(prompt.messages)) + EXACT.count_tools(prompt.tools)
    assert recount == prompt.total_tokens <= max_tokens - 10


def test_a_counter_other_than_the_historys_cannot_break_the_budget() -> None:
    """context.py: history tokens come from the history's counter, the rest from `counter`.

    With an approximate history counter and an exact prompt counter, a prompt the manager
    counts at a few hundred tokens really holds far more than the budget.
    """
    exact = TiktokenCounter()
    history = History(counter=ApproxCounter())
    history.add(UserMessage(content="漢字" * 600))
    with pytest.raises(UserError, match="history's own counter"):
        ContextManager(Environment(), history, 1500, counter=exact, reserve_output_tokens=100)


# -- agent/: exceptions that escape the loop -------------------------------------------------


def _summarizing_model() -> FunctionLLM:
    """A model that takes many mid-sized turns and fails every summary request."""
    turns = 0

    def answer(request: LLMRequest) -> Reply:
        nonlocal turns
        if not request.tools:  # LLMSummarizer's request: it offers no tools
            return fail(ModelConnectionError("the summary model is unreachable"))
        turns += 1
        if turns > 20:
            return "done"
        return reply("x " * 300, tool_calls=[call("add", a=turns, b=2)])

    return FunctionLLM(answer)


async def test_a_model_failure_while_summarizing_ends_the_run_with_an_error() -> None:
    """agent/_loop.py `_Run._after_step`: a ModelError from the summarize strategy escapes `run`."""
    agent = make_agent(
        _summarizing_model(),
        context=ContextConfig(
            max_tokens=2500, reserve_output_tokens=200, counter="approx", strategy="summarize"
        ),
    )
    outcome = await agent.run("go")
    assert outcome.stop_reason is StopReason.ERROR


async def test_after_a_run_raised_the_agent_can_run_again_and_subscribers_were_closed() -> None:
    """agent/_loop.py `_Run.execute` only handled CancelledError: any other exception left
    `_run` set.

    The agent then refuses every later run ("already running") and its subscribers wait
    for events forever because the bus is never closed.
    """
    agent = make_agent(
        _summarizing_model(),
        context=ContextConfig(
            max_tokens=2500, reserve_output_tokens=200, counter="approx", strategy="summarize"
        ),
    )
    subscription = agent.subscribe()

    async def collect() -> list[AgentEvent]:
        return [event async for event in subscription]

    reader = asyncio.create_task(collect())
    with contextlib.suppress(Exception):
        await agent.run("go")
    try:
        async with asyncio.timeout(2):
            events = await reader
    except TimeoutError:
        pytest.fail("the subscription was never closed after the run ended with an exception")
    assert events[-1].kind == "run_finished"
    agent.llm = ScriptedLLM(["fine"])
    assert (await agent.send("again")).final_text == "fine"


def test_an_invalid_output_schema_is_refused_by_the_config() -> None:
    """config.py: `output_schema` is never checked as a JSON schema."""
    with pytest.raises(ValidationError):
        AgentConfig(output_schema={"type": "nonsense"})


def test_an_invalid_output_schema_fails_when_the_config_is_built_not_mid_run() -> None:
    """agent/_output.py `_validate_output`: jsonschema's UnknownType/SchemaError escaped the loop;
    the config now refuses the schema up front."""
    with pytest.raises(ValidationError, match="not a valid JSON schema"):
        AgentConfig(output_schema={"type": "nonsense"})


async def test_nan_in_tool_arguments_is_reported_to_the_model_not_a_crash() -> None:
    """agent/_loop.py `_Run._finish`: NaN (which json.loads accepts) failed RunFinished validation.

    Arguments with NaN or Infinity are now invalid JSON for the model to correct.
    """
    llm = ScriptedLLM(
        [
            reply(tool_calls=[call("task_completion", raw='{"summary": "done", "result": NaN}')]),
            reply(tool_calls=[call("task_completion", summary="done", result=0)]),
        ]
    )
    agent = make_agent(llm)
    outcome = await agent.run("go")
    assert outcome.stop_reason is StopReason.COMPLETED
    assert outcome.final_text == "done"
    assert outcome.tool_uses[0].is_error
    assert "NaN is not a JSON number" in outcome.tool_uses[0].content


@pytest.mark.parametrize(
    ("number", "problem"),
    [
        ("NaN", "NaN is not a JSON number"),
        ("-Infinity", "-Infinity is not a JSON number"),
        ("1e400", "1e400 is out of a number's range"),
        ('"inf"', "at /value: Input should be a finite number"),  # pydantic reads it as a float
        ('"nan"', "at /value: Input should be a finite number"),
    ],
)
async def test_a_number_json_cannot_carry_in_a_structured_answer_is_sent_back_not_a_crash(
    tmp_path: Path, number: str, problem: str
) -> None:
    """agent/_output.py: the answer was read with json.loads, which takes NaN and Infinity and
    reads 1e400 as infinity; RunFinished then refused the output and a pydantic
    ValidationError escaped `run`. Now the model is told, and its next answer is taken."""

    class Reading(BaseModel):
        value: float

    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        llm = ScriptedLLM([reply(f'{{"value": {number}}}'), reply('{"value": 1.5}')])
        agent = AgentExecutor(llm, store=store, output_type=Reading)
        outcome = await agent.run("measure it")
        assert outcome.stop_reason is StopReason.COMPLETED
        assert outcome.output == {"value": 1.5}
        assert problem in llm.requests[1].messages[-1].content
        assert agent.session_id is not None
        events = await store.events(agent.session_id)
        assert events[-1].kind == "run_finished"


async def test_a_number_out_of_range_in_tool_arguments_is_reported_to_the_model() -> None:
    llm = ScriptedLLM(
        [
            reply(tool_calls=[call("task_completion", raw='{"summary": "done", "result": 1e400}')]),
            reply(tool_calls=[call("task_completion", summary="done", result=0)]),
        ]
    )
    outcome = await make_agent(llm).run("go")
    assert outcome.stop_reason is StopReason.COMPLETED
    assert "1e400 is out of a number's range" in outcome.tool_uses[0].content


async def test_a_tool_call_without_a_name_is_reported_to_the_model_and_the_run_recovers() -> None:
    """agent/_steps.py `_record_turn`: `ToolCall` allows an empty name (marked with a
    ``parse_error`` for the loop to report), but ``history.ToolCallEntry`` requires a name, so the
    pydantic ValidationError escapes `run` and the agent stays "already running".
    """
    agent = make_agent(ScriptedLLM([reply(tool_calls=[call("", a=1)]), "recovered"]))
    outcome = await agent.run("go")
    assert outcome.final_text == "recovered"
    assert outcome.tool_uses[0].is_error
    assert_history_consistent(agent)


# -- agent/: cancellation --------------------------------------------------------------------


def _hanging_agent() -> tuple[AgentExecutor, asyncio.Event]:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "impossible"

    agent = make_agent(ScriptedLLM([reply(tool_calls=[call("wait_forever")])]))
    agent.tools.register(wait_forever)
    return agent, started


async def test_calling_cancel_twice_leaves_no_cancellation_pending_on_the_caller() -> None:
    """agent/_loop.py `_Run.cancel`: each call did `task.cancel()`; `execute` uncancels once."""
    agent, started = _hanging_agent()

    async def run_and_report() -> tuple[StopReason, int]:
        outcome = await agent.run("hang")
        task = asyncio.current_task()
        assert task is not None
        return outcome.stop_reason, task.cancelling()

    running = asyncio.create_task(run_and_report())
    await started.wait()
    agent.cancel()
    agent.cancel()  # e.g. a user pressing "stop" twice
    reason, cancelling = await running
    assert reason is StopReason.CANCELLED
    assert cancelling == 0


async def test_cancel_while_the_run_is_finishing_does_not_leak_into_the_caller() -> None:
    """agent/_loop.py `_Run._finish`: the run stays current while RunFinished is published
    and the step saved, so `cancel()` then cancelled the caller's task after `run` returned.
    """
    agent = make_agent(ScriptedLLM(["done"]))
    agent.events.on("run_finished", lambda event: agent.cancel())

    async def run_and_report() -> tuple[StopReason, int]:
        outcome = await agent.run("go")
        task = asyncio.current_task()
        assert task is not None
        # A request left pending here is delivered at the caller's next await, far from
        # the agent, as a CancelledError out of nowhere.
        return outcome.stop_reason, task.cancelling()

    reason, cancelling = await run_and_report()
    assert reason in (StopReason.ANSWERED, StopReason.CANCELLED)
    assert cancelling == 0


async def test_external_cancellation_keeps_history_consistent_and_reraises() -> None:
    """PINS (passes): cancelling the task mid-tool closes the call and re-raises."""
    agent, started = _hanging_agent()
    running = asyncio.create_task(agent.run("hang"))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert_history_consistent(agent)


async def test_two_agents_sharing_a_tool_executor_both_publish_their_tool_events() -> None:
    """agent/executor.py `__init__` overwrote ``tools.hooks`` with its own `_EventHooks`: the
    last agent built on a shared executor (e.g. one with MCP servers registered once) took
    every tool event, and the first agent's runs lost theirs (`_emit` drops them: no run).
    """
    tools = ToolExecutor()
    tools.register(add)
    config = AgentConfig(context=ContextConfig(counter="approx"))
    first = AgentExecutor(
        ScriptedLLM([reply(tool_calls=[call("add", a=1, b=2)]), "done"]),
        config=config,
        tools=tools,
    )
    AgentExecutor(ScriptedLLM([]), config=config, tools=tools)
    subscription = first.subscribe()

    async def collect() -> list[str]:
        return [event.kind async for event in subscription]

    reader = asyncio.create_task(collect())
    await first.run("add")
    kinds = await reader
    assert "tool_call_started" in kinds
    assert "tool_call_completed" in kinds


# -- events.py -------------------------------------------------------------------------------


async def test_a_subscription_read_through_wait_for_keeps_receiving_events() -> None:
    """events.py `_watch_consumer`: the subscription leaves the bus when the *task* that first
    read it ends. On Python 3.11 `asyncio.wait_for` (and `create_task(anext(sub))`, the usual
    way to multiplex several sources) run each read in a short-lived task, so the
    subscription is abandoned — queue cleared — after the first event.
    """
    bus = EventBus()
    subscription = bus.subscribe()
    await bus.publish(warning(0))
    await bus.publish(warning(1))
    first = await asyncio.wait_for(anext(subscription), timeout=5)
    assert first.seq == 0
    await bus.publish(warning(2))
    second = await asyncio.wait_for(anext(subscription), timeout=5)
    assert second.seq == 1


async def test_a_filtered_waiting_subscriber_does_not_reorder_events_for_the_others() -> None:
    """agent/_loop.py `_Run.emit` numbers events before publishing; parallel tool hooks publish
    concurrently. A full ``"wait"`` subscriber that filters kinds blocks one hook's event
    while another hook's later event passes (it is not wanted there) and reaches every
    other subscriber first.
    """

    @tool
    async def first() -> str:
        """Yield once, then answer."""
        await asyncio.sleep(0)  # a tool that awaits anything at all
        return "one"

    @tool
    def second() -> str:
        """Answer at once."""
        return "two"

    llm = ScriptedLLM([reply(tool_calls=[call("first"), call("second")]), "done"])
    agent = make_agent(llm)
    agent.tools.register(first)
    agent.tools.register(second)
    starts = agent.subscribe(kinds={"tool_call_started"}, maxsize=1, policy="wait")
    everything = agent.subscribe()

    async def read_all() -> list[AgentEvent]:
        return [event async for event in everything]

    async def read_starts_slowly() -> list[AgentEvent]:
        # A slow reader: with "wait" it holds the publisher back, which must keep order.
        seen = []
        async for event in starts:
            seen.append(event)
            for _ in range(3):
                await asyncio.sleep(0)
        return seen

    readers = [asyncio.create_task(read_all()), asyncio.create_task(read_starts_slowly())]
    async with asyncio.timeout(5):
        outcome = await agent.run("go")
        seen, _ = await asyncio.gather(*readers)
    assert outcome.stop_reason is StopReason.ANSWERED
    seqs = [event.seq for event in seen]
    inversions = [
        f"{a.seq}:{a.kind} before {b.seq}:{b.kind}"
        for a, b in itertools.pairwise(seen)
        if a.seq > b.seq
    ]
    assert seqs == sorted(seqs), inversions


async def test_a_reader_that_raises_does_not_stall_a_waiting_publisher() -> None:
    """PINS (passes): a ``"wait"`` subscriber whose reader raised leaves the bus."""
    bus = EventBus()
    subscription = bus.subscribe(maxsize=1, policy="wait")

    async def bad_reader() -> None:
        async for _ in subscription:
            raise RuntimeError("reader bug")

    reader = asyncio.create_task(bad_reader())
    await bus.publish(warning(0))
    with pytest.raises(RuntimeError):
        await reader
    async with asyncio.timeout(2):
        for seq in range(1, 5):
            await bus.publish(warning(seq))


# -- config.py ---------------------------------------------------------------------------


def test_deny_tools_can_withhold_a_loop_control_tool() -> None:
    """tools/filters.py `ToolFilter.allows` (once agent.py `_callable`) returned True for
    control tools before looking at `deny_tools`, whose documentation says denied tools are
    "never offered".
    """
    agent = make_agent(ScriptedLLM([]), deny_tools=("converse",))
    assert "converse" not in {d.name for d in agent.offered_tools()}


def test_an_environment_override_of_a_text_field_keeps_text_that_looks_like_a_number() -> None:
    """config.py `_parse_env_value`: every value is tried as TOML first, so a string field
    set to "2024" or "true" through the environment becomes an int/bool and is rejected.
    """
    try:
        config = load_config(environ={"AGENT_FLOW_NAME": "2024"})
    except ConfigError as err:
        pytest.fail(f"AGENT_FLOW_NAME=2024 was refused: {err}")
    assert config.name == "2024"


# -- one tokenizer per agent -----------------------------------------------------------------


async def test_an_agents_tools_truncate_in_the_tokens_its_budget_counts() -> None:
    """The agent's counter reaches the tool executor it builds and one given without a
    counter: results are cut in the budget's tokens, and no second tokenizer is loaded (an
    agent of an ``o200k_base`` model loaded ``cl100k_base`` too, for truncation alone)."""
    from agent_flow import AgentConfig, AgentExecutor
    from agent_flow.testing import FunctionLLM, call, reply
    from agent_flow.tools import ToolExecutor, tool

    @tool
    def shout() -> str:
        """Shout."""
        return "A" * 400

    def answer(request: LLMRequest) -> Reply:
        if any(m.role == "tool" for m in request.messages):
            return reply("done")
        return reply(tool_calls=[call("shout")])

    approx = AgentConfig.model_validate({"context": {"counter": "approx"}})
    built = AgentExecutor(FunctionLLM(answer), config=approx)
    assert built.tools.counter is built.context.counter
    tools = ToolExecutor([shout], max_output_tokens=32)
    assert isinstance(tools.counter, TiktokenCounter)  # read before any agent: the default
    given = AgentExecutor(FunctionLLM(answer), config=approx, tools=tools)
    assert isinstance(given.tools.counter, ApproxCounter)
    outcome = await given.run("shout")
    [use] = outcome.tool_uses
    assert "of 100 tokens cut" in use.content  # 400 characters / 4: the agent's count
    gpt4o = AgentConfig.model_validate({"llm": {"model": "gpt-4o"}})
    agent = AgentExecutor(FunctionLLM(answer), config=gpt4o)
    assert isinstance(agent.tools.counter, TiktokenCounter)
    assert agent.tools.counter.encoding_name == "o200k_base"
    own = ToolExecutor(counter=TiktokenCounter())
    assert AgentExecutor(FunctionLLM(answer), config=gpt4o, tools=own).tools.counter is own.counter


async def test_a_run_task_cancelled_before_it_starts_ends_its_subscriptions_at_once() -> None:
    """A task of `agent.run` cancelled before its first step never ran a line of the run:
    its subscription waited for the *next* run to end (forever, if none came)."""
    agent = make_agent(ScriptedLLM(["never", "again"]))
    subscription = agent.subscribe()
    running = asyncio.create_task(agent.run("go"))
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    async with asyncio.timeout(5):
        assert [event async for event in subscription] == []
    # The agent is free, and its next run is a run like any other.
    later = agent.subscribe()
    reader = asyncio.create_task(_kinds(later))
    assert (await agent.run("again")).final_text == "never"
    kinds = await asyncio.wait_for(reader, 5)
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"


async def test_a_run_coroutine_closed_unstarted_frees_the_agent_and_its_subscriptions() -> None:
    agent = make_agent(ScriptedLLM(["one"]))
    subscription = agent.subscribe()
    agent.run("go").close()
    async with asyncio.timeout(5):
        assert [event async for event in subscription] == []
    assert (await agent.run("go")).final_text == "one"


@settings(max_examples=20, deadline=None)
@given(yields=st.integers(min_value=0, max_value=12))
def test_a_run_task_cancelled_at_any_point_ends_its_subscription_and_frees_the_agent(
    yields: int,
) -> None:
    """Cancelled before it starts or anywhere in its run: the subscription ends (never a
    wait for a run that will not come), what it got ends with the run's own end if the run
    began, and the agent runs again."""

    async def scene() -> None:
        agent = make_agent(
            ScriptedLLM([reply(tool_calls=[call("add", a=1, b=2)]), "three", "again"])
        )
        subscription = agent.subscribe()
        reader = asyncio.create_task(_kinds(subscription))
        running = asyncio.create_task(agent.run("go"))
        for _ in range(yields):
            await asyncio.sleep(0)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        kinds = await asyncio.wait_for(reader, 5)
        assert kinds == [] or (kinds[0], kinds[-1]) == ("run_started", "run_finished"), kinds
        assert (await agent.run("more")).stop_reason is StopReason.ANSWERED

    asyncio.run(scene())


async def test_a_run_task_shows_the_run_in_its_repr_and_its_stack() -> None:
    agent = make_agent(ScriptedLLM(["one"]))
    running = asyncio.create_task(agent.run("go"))
    assert "_execute" in repr(running)
    assert running.get_stack()  # the run's frame, read through the wrapper
    await running


async def _kinds(subscription: AsyncIterator[AgentEvent]) -> list[str]:
    return [event.kind async for event in subscription]
