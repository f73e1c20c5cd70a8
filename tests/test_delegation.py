"""Delegation (`agent_flow.delegation`): a child agent as a tool of its parent.

The child sees only the projected part of the parent's Environment, returns a typed result
that the parent's handlers write into the parent's Environment, and is part of the parent's
run: its events reach the parent's subscribers under a path, its usage rolls up into the
parent's totals, the parent's limits cover it, cancelling the parent cancels it, and the
parent's approver answers it. Several children of one step run concurrently, bounded.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Delegate, Environment, Pricing
from agent_flow.agent import StopReason
from agent_flow.delegation import DelegationResult, project_environment
from agent_flow.errors import UserError
from agent_flow.events import AgentEvent, ApprovalRequired, ContextBuilt, RunFinished
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.messages import ToolCall
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM, call, reply
from agent_flow.tools import ApprovalRequest, ToolExecutor, ToolPolicy, tool
from tests.helpers import stdio_server

APPROX = ContextConfig(max_tokens=6000, counter="approx")
SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class Findings(BaseModel):
    facts: list[str]


@tool(policy=ToolPolicy(read_only=True))
def read_file(path: str) -> str:
    """Read a file.

    Args:
        path: The file.
    """
    return f"contents of {path}"


@tool
def write_file(path: str, text: str) -> str:
    """Write a file.

    Args:
        path: The file.
        text: The text.
    """
    return f"wrote {path}"


def parent_agent(llm: Any, *delegates: Delegate[Any], **config: Any) -> AgentExecutor:
    agent = AgentExecutor(llm, config=AgentConfig(context=APPROX, **config))
    for delegate in delegates:
        delegate.add_to(agent)
    return agent


def delegating(*tasks: str, name: str = "investigate") -> FunctionLLM:
    """A parent model: delegates `tasks` in one step, then answers with what came back."""

    def play(request: LLMRequest) -> Reply:
        if request.messages[-1].role == "tool":
            results = [m.content for m in request.messages if m.role == "tool"]
            return reply("parent done: " + " | ".join(str(r) for r in results))
        return reply(tool_calls=[call(name, task=t) for t in tasks])

    return FunctionLLM(play, model="parent")


def finding(*facts: str) -> Reply:
    return reply(tool_calls=[call("task_completion", summary="found", result={"facts": facts})])


# -- the projection --------------------------------------------------------------------

#: Pointers a parent's environment may hold, each with a value carrying a unique marker.
CANDIDATES = (
    "/knowledge/discovered_facts",
    "/knowledge/key_concepts",
    "/knowledge/sources",
    "/knowledge/extra/design",
    "/knowledge/extra/secrets",
    "/workspace/extra/notes",
    "/extensions/datasets",
    "/extensions/plan/deep",
    "/task/objective",
    "/task/current_step",
    "/system/working_directory",
)


def marked(pointer: str, marker: str) -> Any:
    if pointer in ("/knowledge/discovered_facts", "/knowledge/key_concepts"):
        return [f"{marker}-a", f"{marker}-b"]
    if pointer == "/knowledge/sources":
        return {f"{marker}-src": f"https://example.invalid/{marker}"}
    if pointer.startswith(("/task/", "/system/")):
        return marker
    return {"value": marker}


@st.composite
def parents_and_projections(draw: st.DrawFn) -> tuple[Environment, dict[str, str], list[str]]:
    """A parent environment with a marker under each chosen pointer, and a projection."""
    present = draw(st.lists(st.sampled_from(CANDIDATES), unique=True, min_size=1))
    parent = Environment()
    markers: dict[str, str] = {}
    for index, pointer in enumerate(present):
        markers[pointer] = f"MARK{index}Q{draw(st.integers(0, 10**6))}"
        parent.set(pointer, marked(pointer, markers[pointer]))
    projection = draw(st.lists(st.sampled_from(CANDIDATES), unique=True, max_size=5))
    return parent, markers, projection


def projected_markers(markers: dict[str, str], projection: list[str]) -> set[str]:
    return {marker for pointer, marker in markers.items() if pointer in projection}


@SETTINGS
@given(parents_and_projections(), st.text(alphabet="abcdefgh ", max_size=30))
def test_a_projected_environment_holds_nothing_outside_the_projection(
    drawn: tuple[Environment, dict[str, str], list[str]], task: str
) -> None:
    parent, markers, projection = drawn
    child = project_environment(parent, projection, task=task)
    state = json.dumps(child.get(""))
    for pointer, marker in markers.items():
        assert (marker in state) is (pointer in projection), (pointer, projection)
    for pointer in projection:
        if pointer in markers:
            target = pointer.replace("/task", "/extensions/parent_task", 1)
            assert child.get(target) == parent.get(pointer)
    assert child.task.objective == task


@settings(max_examples=12, deadline=None)
@given(parents_and_projections())
async def test_a_child_is_never_shown_anything_outside_the_projection(
    drawn: tuple[Environment, dict[str, str], list[str]],
) -> None:
    parent_env, markers, projection = drawn
    child_llm = ScriptedLLM([finding("x")])
    delegate = Delegate(
        "investigate", "Investigate.", llm=child_llm, projection=projection, output_type=Findings
    )
    agent = AgentExecutor(
        delegating("look around"), config=AgentConfig(context=APPROX), environment=parent_env
    )
    delegate.add_to(agent)
    outcome = await agent.run("the parent's task")
    assert outcome.stop_reason is StopReason.ANSWERED
    sent = json.dumps([m.model_dump(mode="json") for m in child_llm.requests[0].messages])
    # What the parent held when it delegated (its run replaced its objective and plan first).
    held = {p: m for p, m in markers.items() if m in json.dumps(parent_env.get(""))}
    assert {m for m in markers.values() if m in sent} == projected_markers(held, projection)
    objective = json.dumps(parent_env.task.objective)[1:-1]
    assert (objective in sent) is ("/task/objective" in projection)


def test_a_projection_pointer_must_name_a_part_of_the_state() -> None:
    with pytest.raises(UserError, match="must name a part"):
        Delegate("d", "D.", llm=ScriptedLLM([]), projection=[""])
    with pytest.raises(UserError, match="must name a part"):
        project_environment(Environment(), {"/knowledge": "knowledge"})


def test_a_mapping_puts_each_projected_value_where_it_says() -> None:
    parent = Environment()
    parent.set("/task/objective", "ship it")
    parent.set("/knowledge/discovered_facts", ["f"])
    child = project_environment(
        parent,
        {
            "/task/objective": "/knowledge/extra/goal",
            "/knowledge/discovered_facts": "/extensions/f",
        },
        task="look",
    )
    assert child.get("/knowledge/extra/goal") == "ship it"
    assert child.get("/extensions/f") == ["f"]
    assert child.task.objective == "look"


# -- the result ------------------------------------------------------------------------


async def test_the_typed_result_lands_in_the_parent_environment_through_its_handler() -> None:
    child_llm = ScriptedLLM([reply(tool_calls=[call("read_file", path="a.py")]), finding("a")])
    delegate: Delegate[Findings] = Delegate(
        "investigate",
        "Investigate.",
        llm=child_llm,
        tools=[read_file, write_file],
        read_only=True,
        output_type=Findings,
    )
    agent = parent_agent(delegating("read a.py"), delegate)
    outcome = await agent.run("fix a.py")
    assert outcome.stop_reason is StopReason.ANSWERED
    assert agent.environment.get("/knowledge/extra/investigate") == [
        {"task": "read a.py", "result": {"facts": ["a"]}}
    ]
    (use,) = outcome.tool_uses
    assert json.loads(use.content) == {"facts": ["a"]}
    offered = {t.name for t in child_llm.requests[0].tools}
    assert "read_file" in offered and "write_file" not in offered
    assert child_llm.requests[0].messages[0].content.count("read a.py") >= 1


async def test_output_of_reads_the_typed_output_back_from_a_result() -> None:
    delegate: Delegate[Findings] = Delegate(
        "investigate", "I.", llm=ScriptedLLM([finding("a", "b")]), output_type=Findings
    )
    agent = parent_agent(delegating("t"), delegate)
    results: list[Any] = []
    agent.handlers.register("investigate", lambda _env, _call, result: results.append(result))
    await agent.run("go")
    assert delegate.output_of(results[0]) == Findings(facts=["a", "b"])


async def test_a_read_only_child_cannot_call_a_write_tool_even_when_it_tries() -> None:
    child_llm = ScriptedLLM([reply(tool_calls=[call("write_file", path="x", text="y")]), "gave up"])
    delegate = Delegate(
        "investigate", "I.", llm=child_llm, tools=[read_file, write_file], read_only=True
    )
    agent = parent_agent(delegating("t"), delegate)
    await agent.run("go")
    refusal = next(m for m in child_llm.requests[1].messages if m.role == "tool")
    assert "not available" in str(refusal.content)


async def test_a_child_that_does_not_finish_gives_an_error_result_and_no_handler_runs() -> None:
    child_llm = FunctionLLM(lambda _r: reply(tool_calls=[call("read_file", path="a")]))
    delegate = Delegate(
        "investigate",
        "I.",
        llm=child_llm,
        tools=[read_file],
        config=AgentConfig(max_iterations=2, context=APPROX),
    )
    agent = parent_agent(delegating("t"), delegate)
    outcome = await agent.run("go")
    (use,) = outcome.tool_uses
    assert use.is_error and "max_iterations" in use.content
    assert not agent.environment.has("/knowledge/extra/investigate")


# -- one run, one tree -----------------------------------------------------------------


async def collect(agent: AgentExecutor, task: str) -> tuple[Any, list[AgentEvent]]:
    subscription = agent.subscribe()
    outcome = await agent.run(task)
    return outcome, [event async for event in subscription]


async def test_child_and_grandchild_events_reach_the_parent_with_their_path() -> None:
    grandchild = Delegate("dig", "Dig.", llm=ScriptedLLM(["bedrock"]))
    child_llm = FunctionLLM(
        lambda r: (
            reply("child saw " + str(r.messages[-1].content))
            if r.messages[-1].role == "tool"
            else reply(tool_calls=[call("dig", task="deeper")])
        )
    )
    child = Delegate("investigate", "I.", llm=child_llm, tools=[grandchild])
    agent = parent_agent(delegating("look"), child)
    outcome, events = await collect(agent, "go")
    assert outcome.final_text == "parent done: child saw bedrock"
    runs: dict[str, tuple[str, ...]] = {}
    for event in events:
        assert runs.setdefault(event.run_id, event.path) == event.path
    (child_id,) = [r for r, p in runs.items() if p == (outcome.run_id,)]
    (grandchild_id,) = [r for r, p in runs.items() if len(p) == 2]
    assert runs == {
        outcome.run_id: (),
        child_id: (outcome.run_id,),
        grandchild_id: (outcome.run_id, child_id),
    }
    assert len(runs) == 3
    # One run, one tree, one sequence: the children's events take the parent's next numbers.
    assert [e.seq for e in events] == list(range(len(events)))
    for run_id in runs:
        assert [e.kind for e in events if e.run_id == run_id][-1] == "run_finished"
    top = [e for e in events if not e.path]
    assert {e.run_id for e in top} == {outcome.run_id}


async def test_usage_and_cost_roll_up_into_the_parent_totals() -> None:
    used = Usage(prompt_tokens=100, completion_tokens=10)
    child_llm = ScriptedLLM([reply("a", usage=used), reply("b", usage=used)])
    delegate = Delegate("investigate", "I.", llm=child_llm)
    pricing = Pricing(input_per_million=1.0, output_per_million=2.0)
    agent = parent_agent(delegating("t1", "t2"), delegate, pricing=pricing)
    outcome, events = await collect(agent, "go")
    assert len(outcome.usage_per_call) == 4  # two of the parent's, one per child
    assert outcome.usage.total_tokens == sum(u.total_tokens for u in outcome.usage_per_call)
    children = [e for e in events if isinstance(e, RunFinished) and e.path]
    assert sum(e.prompt_tokens for e in children) == 200
    (finished,) = [e for e in events if isinstance(e, RunFinished) and not e.path]
    assert finished.prompt_tokens == outcome.usage.prompt_tokens
    # The children's model is unpriced (no pricing in their config): the total is unknown.
    assert outcome.cost_usd is None


async def test_the_parent_token_limit_covers_its_children() -> None:
    used = Usage(prompt_tokens=400, completion_tokens=100)
    child_llm = FunctionLLM(
        lambda _r: reply(tool_calls=[call("read_file", path="a")], usage=used), model="child"
    )
    delegate = Delegate("investigate", "I.", llm=child_llm, tools=[read_file])
    agent = parent_agent(delegating("t"), delegate, max_total_tokens=2000)
    outcome = await agent.run("go")
    (use,) = outcome.tool_uses
    assert use.is_error and "token_limit" in use.content
    assert outcome.stop_reason is StopReason.TOKEN_LIMIT
    # The child stopped as soon as the parent's total reached its limit.
    assert 2000 <= outcome.usage.total_tokens < 2000 + used.total_tokens


@settings(max_examples=20, deadline=None)
@given(
    children=st.integers(1, 4),
    calls=st.integers(1, 4),
    limit_calls=st.floats(0.5, 12.0),
)
async def test_parallel_children_together_never_pass_the_parent_cost_limit(
    children: int, calls: int, limit_calls: float
) -> None:
    # Each child call bills its whole output allowance: it costs about its worst case.
    pricing = Pricing(input_per_million=0.001, output_per_million=1000.0)

    async def play(request: LLMRequest) -> Reply:
        await asyncio.sleep(0)  # the other children go on while this call is in flight
        used = Usage(prompt_tokens=1, completion_tokens=request.max_tokens or 0)
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < calls:
            return reply(tool_calls=[call("read_file", path=str(done))], usage=used)
        return reply("enough", usage=used)

    child_config = AgentConfig(context=ContextConfig(max_tokens=1500, counter="approx"))
    child_config = child_config.model_copy(update={"pricing": pricing})
    delegate = Delegate(
        "investigate",
        "I.",
        llm=FunctionLLM(play, model="child"),
        config=child_config,
        tools=[read_file],
    )
    # A child call's allowance is 375 tokens: it costs $0.375.
    limit = limit_calls * 0.375
    parent = AgentConfig(context=APPROX, pricing=pricing, max_cost_usd=limit)
    agent = AgentExecutor(
        delegating(*[f"t{i}" for i in range(children)]), config=parent, stream=False
    )
    delegate.add_to(agent)
    outcome = await agent.run("go")
    assert outcome.cost_usd is not None
    assert outcome.cost_usd <= limit + 1e-9


# -- cancellation, approval, parallel children -----------------------------------------


async def test_cancelling_the_parent_cancels_the_child_in_its_tool() -> None:
    started = asyncio.Event()
    cancelled: list[bool] = []

    @tool(policy=ToolPolicy(read_only=True))
    async def wait_forever() -> str:
        """Wait."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    child_llm = ScriptedLLM([reply(tool_calls=[call("wait_forever")])])
    delegate = Delegate("investigate", "I.", llm=child_llm, tools=[wait_forever])
    agent = parent_agent(delegating("t"), delegate)
    subscription = agent.subscribe()
    task = asyncio.create_task(agent.run("go"))
    await started.wait()
    agent.cancel()
    outcome = await task
    assert outcome.stop_reason is StopReason.CANCELLED
    assert cancelled == [True]
    events = [e async for e in subscription]
    ends = {e.run_id: e.stop_reason for e in events if isinstance(e, RunFinished)}
    assert set(ends.values()) == {"cancelled"} and len(ends) == 2


async def test_the_parents_approver_answers_the_childs_approval_requests() -> None:
    asked: list[ApprovalRequest] = []

    async def approver(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True

    @tool(policy=ToolPolicy(requires_approval=True))
    def deploy() -> str:
        """Deploy."""
        return "deployed"

    child_llm = ScriptedLLM([reply(tool_calls=[call("deploy")]), "deployed it"])
    delegate = Delegate("ship", "Ship.", llm=child_llm, tools=[deploy])
    agent = AgentExecutor(
        delegating("ship it", name="ship"), config=AgentConfig(context=APPROX), approval=approver
    )
    delegate.add_to(agent)
    outcome, events = await collect(agent, "go")
    assert [r.tool_name for r in asked] == ["deploy"]
    assert outcome.final_text == "parent done: deployed it"
    (required,) = [e for e in events if isinstance(e, ApprovalRequired)]
    assert required.path == (outcome.run_id,)


async def test_children_of_one_step_run_concurrently_within_the_bound() -> None:
    running = 0
    most = 0
    two_in = asyncio.Event()

    @tool(policy=ToolPolicy(read_only=True))
    async def work() -> str:
        """Work."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 2:
            two_in.set()
        await two_in.wait()
        for _ in range(5):
            await asyncio.sleep(0)
        running -= 1
        return "worked"

    def play(request: LLMRequest) -> Reply:
        if request.messages[-1].role == "tool":
            return reply("child done")
        return reply(tool_calls=[call("work")])

    delegate = Delegate("investigate", "I.", llm=FunctionLLM(play), tools=[work], max_concurrency=2)
    agent = parent_agent(delegating("a", "b", "c", "d"), delegate)
    outcome = await agent.run("go")
    assert most == 2
    assert outcome.final_text.count("child done") == 4


def test_max_concurrency_must_be_positive() -> None:
    with pytest.raises(UserError, match="max_concurrency"):
        Delegate("d", "D.", llm=ScriptedLLM([]), max_concurrency=0)


@settings(max_examples=15, deadline=None)
@given(
    parent_budget=st.integers(2500, 6000),
    child_budgets=st.lists(st.integers(1200, 3000), min_size=1, max_size=3),
    fact_words=st.integers(0, 600),
    result_words=st.integers(0, 800),
)
async def test_every_prompt_of_parent_and_children_fits_its_own_budget(
    parent_budget: int, child_budgets: list[int], fact_words: int, result_words: int
) -> None:
    """The budget invariant with children: each prompt fits the budget of the agent it is for."""

    @tool(policy=ToolPolicy(read_only=True))
    def big() -> str:
        """A large result."""
        return "word " * result_words

    def child_play(request: LLMRequest) -> Reply:
        if sum(1 for m in request.messages if m.role == "tool") < 2:
            return reply(tool_calls=[call("big")])
        return reply("finding " * 20)

    delegates = [
        Delegate(
            f"child{i}",
            "C.",
            llm=FunctionLLM(child_play),
            tools=[big],
            projection=["/knowledge/discovered_facts"],
            budget=ContextConfig(max_tokens=budget, counter="approx"),
        )
        for i, budget in enumerate(child_budgets)
    ]

    def parent_play(request: LLMRequest) -> Reply:
        if request.messages[-1].role == "tool":
            return reply("done")
        return reply(tool_calls=[call(d.name, task="look") for d in delegates])

    agent = AgentExecutor(
        FunctionLLM(parent_play),
        config=AgentConfig(context=ContextConfig(max_tokens=parent_budget, counter="approx")),
    )
    agent.environment.set("/knowledge/discovered_facts", ["fact " * fact_words])
    for delegate in delegates:
        delegate.add_to(agent)
    outcome, events = await collect(agent, "go")
    assert outcome.stop_reason is StopReason.ANSWERED
    built = [e for e in events if isinstance(e, ContextBuilt)]
    children = {e.run_id for e in built if e.path}
    assert len(children) == len(child_budgets)  # every child made at least one prompt
    for event in built:
        breakdown = event.breakdown
        assert breakdown.total <= breakdown.budget - breakdown.reserve
        if event.path:
            assert breakdown.budget in child_budgets
        else:
            assert breakdown.budget == parent_budget


async def test_a_delegate_outside_any_run_still_runs_its_child() -> None:
    delegate = Delegate("investigate", "I.", llm=ScriptedLLM(["alone"]))
    outcome = await ToolExecutor([delegate]).execute_one(
        ToolCall(id="c", name="investigate", arguments='{"task": "t"}')
    )
    assert outcome.result.content == "alone"
    assert DelegationResult.model_validate(outcome.result.data).stop_reason is StopReason.ANSWERED


async def test_a_child_whose_config_names_mcp_servers_starts_and_stops_them() -> None:
    child_llm = ScriptedLLM(
        [reply(tool_calls=[call("basic_echo", text="from the child")]), "echoed"]
    )
    config = AgentConfig(context=APPROX, mcp_servers=(stdio_server("basic", "basic_server.py"),))
    delegate = Delegate("investigate", "I.", llm=child_llm, config=config)
    agent = parent_agent(delegating("t"), delegate)
    outcome = await agent.run("go")
    assert outcome.final_text == "parent done: echoed"
    echoed = [m for m in child_llm.requests[1].messages if m.role == "tool"]
    assert "from the child" in str(echoed[0].content)
    assert "basic_echo" not in delegate.tools  # its tools left with its server
