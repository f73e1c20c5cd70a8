"""Delegation in a durable run: the child is one checkpointed tool call, never run again once done.

As in `tests/test_durable_steps.py`, one durable run is executed once to count its writes,
then, for every write W, an attempt "crashes" at W and a second attempt recovers the run from
what the store holds. The parent delegates twice (one child per turn); each child's model
counts its runs. Every time: the run finishes once with both children's findings, and a child
whose result was recorded is not run again (an interrupted one is not either: the delegate is
not idempotent, so it gets an "interrupted" result instead). A recovered run's usage and cost
count each finished child's calls once, as the uncrashed run did, whether the child's result
was replayed or the child ran (again) live.

A durable run's cancel reaches a child mid-run: the child looks before each of its model and
tool calls, as the parent does, and its remaining calls are not made.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow._checkpoints import StepRecordError
from agent_flow.agent import ExecutionOutcome, StopReason
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.delegation import Delegate
from agent_flow.durable._workflow import RunRequest, Runtime, _execute
from agent_flow.errors import StoreError
from agent_flow.events import RunFinished
from agent_flow.llm.base import LLMRequest, Usage
from agent_flow.pricing import Pricing
from agent_flow.testing import FunctionLLM, Reply, call, reply
from agent_flow.tools import ToolExecutor, ToolPolicy, tool
from tests.test_durable_steps import CrashingStore

CONFIG = AgentConfig(control_tools=False, max_iterations=10)


async def execute(
    store: CrashingStore,
    request: RunRequest,
    parent: FunctionLLM,
    tools: list[Any],
    *,
    config: AgentConfig = CONFIG,
) -> Any:
    """One execution of `request` with `parent` as its model; None when a crash stopped it."""
    runtime = Runtime(
        store=store,
        config=config,
        llm_factory=lambda _config: (parent, None),
        tools_factory=lambda _config: ToolExecutor(tools),
        cancel_check_seconds=3600,
    )
    try:
        return await _execute(runtime, request)
    except StepRecordError as err:
        if not isinstance(err.__cause__, StoreError):
            raise
        return None


def parent_play(request: LLMRequest) -> Reply:
    done = sum(1 for m in request.messages if m.role == "tool")
    if done < 2:
        return reply(tool_calls=[call("investigate", task=f"question {done + 1}")])
    return reply("done")


async def attempt(store: CrashingStore, runs: list[str], request: RunRequest) -> Any:
    """One execution of `request`; each child run appends its task to `runs`."""

    def child_play(child_request: LLMRequest) -> Reply:
        task = str(child_request.messages[-1].content)
        runs.append(task)
        return reply(f"answer to {task}")

    delegate = Delegate(
        "investigate",
        "Investigate.",
        llm=FunctionLLM(child_play, model="child"),
        budget=ContextConfig(max_tokens=3000, counter="approx"),
    )
    return await execute(store, request, FunctionLLM(parent_play, model="parent"), [delegate])


async def test_a_finished_child_is_never_run_again_after_a_crash_at_any_write(
    tmp_path: Path,
) -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    runs: list[str] = []
    outcome = await attempt(store, runs, RunRequest(session_id=info.id, message="go", run_id="r"))
    assert outcome is not None and outcome.final_text == "done"
    assert runs == ["question 1", "question 2"]
    total = store.writes
    for crash_at in range(1, total + 1):
        store = CrashingStore()
        info = await store.create(agent="durable")
        request = RunRequest(session_id=info.id, message="go", run_id=f"r{crash_at}")
        runs = []
        store.crash_at = crash_at
        await attempt(store, runs, request)
        store.crash_at = None
        outcome = await attempt(store, runs, request)
        assert outcome is not None and outcome.final_text == "done", crash_at
        assert len(outcome.tool_uses) == 2
        for n, use in enumerate(outcome.tool_uses, start=1):
            assert runs.count(f"question {n}") <= 1, (crash_at, runs)
            if use.error_kind != "interrupted":
                assert use.content == f"answer to question {n}", crash_at
                assert runs.count(f"question {n}") == 1, (crash_at, runs)
        # The run's tree (its children's events are stored with it, in its sequence).
        events = [
            e
            for e in await store.events(info.id)
            if e.run_id == request.run_id or e.path[:1] == (request.run_id,)
        ]
        seqs = [e.seq for e in events]
        assert seqs == sorted(set(seqs)), crash_at  # each number once, in order
        top = [e for e in events if not e.path]
        assert [e.kind for e in top].count("run_finished") == 1, crash_at
        # A child's events are stored whole or not at all (a crash after its result was
        # recorded, before the step's save, loses them: the numbers they took stay unused).
        for child in {e.run_id for e in events if e.path}:
            mine = [e for e in events if e.run_id == child or child in e.path]
            assert mine[0].kind == "run_started" and mine[-1].kind == "run_finished", crash_at
            assert [e.seq for e in mine] == list(range(mine[0].seq, mine[0].seq + len(mine)))
        if crash_at == 1:  # before anything of the children: every event, gap-free
            assert seqs == list(range(len(events)))


# -- usage and cost after a recovery --------------------------------------------------------

PRICES = Pricing(input_per_million=3.0, output_per_million=15.0)
PRICED = CONFIG.model_copy(update={"pricing": PRICES})


def parent_usage(done: int) -> Usage:
    """The parent's model call after `done` results: its own usage, to tell calls apart."""
    return Usage(prompt_tokens=100 * (done + 1), completion_tokens=7, total_tokens=100 * done + 107)


def child_usage(n: int, call_index: int) -> Usage:
    """The child given question `n`, at its call `call_index`."""
    prompt, completion = 11 * n + call_index, 3 * n + 2 * call_index + 1
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def priced_parent_play(request: LLMRequest) -> Reply:
    done = sum(1 for m in request.messages if m.role == "tool")
    if done < 2:
        return reply(
            tool_calls=[call("investigate", task=f"question {done + 1}")], usage=parent_usage(done)
        )
    return reply("done", usage=parent_usage(done))


@tool(policy=ToolPolicy(read_only=True))
async def note(text: str) -> str:
    """Note something down."""
    return f"noted {text}"


async def priced_attempt(
    store: CrashingStore, runs: list[str], request: RunRequest, *, read_only: bool
) -> ExecutionOutcome | None:
    """One execution: each child makes two priced calls (a note, then its answer)."""

    def child_play(child_request: LLMRequest) -> Reply:
        task = str(next(m for m in child_request.messages if m.role == "user").content)
        n = int(task.rsplit(" ", 1)[1])
        calls = sum(1 for m in child_request.messages if m.role == "assistant")
        if calls == 0:
            runs.append(task)
            return reply(tool_calls=[call("note", text=task)], usage=child_usage(n, 0))
        return reply(f"answer to {task}", usage=child_usage(n, 1))

    delegate = Delegate(
        "investigate",
        "Investigate.",
        llm=FunctionLLM(child_play, model="child"),
        config=AgentConfig(name="investigate", control_tools=False, pricing=PRICES),
        tools=[note],
        budget=ContextConfig(max_tokens=3000, counter="approx"),
        read_only=read_only,
    )
    return await execute(
        store, request, FunctionLLM(priced_parent_play, model="parent"), [delegate], config=PRICED
    )


def expected_calls(interrupted: set[int]) -> list[Usage]:
    """The calls counted in the parent: its own, each finished child's two after its first."""
    calls = [parent_usage(0)]
    for n in (1, 2):
        if n not in interrupted:
            calls += [child_usage(n, 0), child_usage(n, 1)]
        calls.append(parent_usage(n))
    return calls


def price(usage: Usage) -> float:
    return (usage.prompt_tokens * 3.0 + usage.completion_tokens * 15.0) / 1_000_000


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_recovered_run_counts_each_finished_childs_usage_and_cost_once(
    read_only: bool,
) -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    runs: list[str] = []
    request = RunRequest(session_id=info.id, message="go", run_id="r")
    full = await priced_attempt(store, runs, request, read_only=read_only)
    assert full is not None and full.final_text == "done"
    # Live: each child's calls are counted once (not again from its result).
    assert list(full.usage_per_call) == expected_calls(set())
    assert full.usage.total_tokens == sum(u.total_tokens for u in expected_calls(set()))
    assert full.cost_per_call == pytest.approx(tuple(price(u) for u in expected_calls(set())))
    total = store.writes
    for crash_at in range(1, total + 1):
        store = CrashingStore()
        info = await store.create(agent="durable")
        request = RunRequest(session_id=info.id, message="go", run_id=f"r{crash_at}")
        store.crash_at = crash_at
        await priced_attempt(store, [], request, read_only=read_only)
        store.crash_at = None
        outcome = await priced_attempt(store, [], request, read_only=read_only)
        assert outcome is not None and outcome.final_text == "done", crash_at
        interrupted = {
            n for n, use in enumerate(outcome.tool_uses, start=1) if use.error_kind == "interrupted"
        }
        assert not (read_only and interrupted)  # a read-only child runs again instead
        if not interrupted:
            assert outcome.usage == full.usage, crash_at
            assert outcome.usage_per_call == full.usage_per_call, crash_at
            assert outcome.cost_per_call == full.cost_per_call, crash_at
            assert outcome.cost_usd == full.cost_usd, crash_at
        else:
            # What an interrupted child spent was never recorded: the rest is counted.
            assert list(outcome.usage_per_call) == expected_calls(interrupted), crash_at
        assert outcome.cost_per_call == pytest.approx(tuple(map(price, outcome.usage_per_call)))
        assert outcome.cost_usd == sum(c for c in outcome.cost_per_call if c is not None)
        events = await store.events(info.id, run_id=request.run_id)
        finished = [e for e in events if isinstance(e, RunFinished)]
        assert len(finished) == 1, crash_at
        assert finished[0].prompt_tokens == outcome.usage.prompt_tokens, crash_at
        assert finished[0].completion_tokens == outcome.usage.completion_tokens, crash_at
        assert finished[0].cost_usd == outcome.cost_usd, crash_at


# -- cancelling a durable run reaches its child ---------------------------------------------


@settings(max_examples=20)
@given(flip_after=st.integers(0, 6), width=st.integers(1, 3))
async def test_cancelling_a_durable_run_stops_its_child_before_its_next_call(
    flip_after: int, width: int
) -> None:
    """The status flips once the child made `flip_after` tool calls (`width` per turn)."""
    scripted_turns = 8  # more than any example needs: some calls are always left
    ticks: list[int] = []
    child_calls: list[int] = []

    @tool
    async def tick() -> str:
        """Tick once."""
        ticks.append(len(ticks) + 1)
        return "ticked"

    def child_play(request: LLMRequest) -> Reply:
        child_calls.append(len(child_calls) + 1)
        if len(child_calls) <= scripted_turns:
            return reply(tool_calls=[call("tick") for _ in range(width)])
        return reply("ticked enough")

    def parent(request: LLMRequest) -> Reply:
        if any(m.role == "tool" for m in request.messages):
            return reply("done")
        return reply(tool_calls=[call("investigate", task="tick away")])

    async def status(_run_id: str) -> str | None:
        return "CANCELLED" if len(ticks) >= flip_after else "PENDING"

    delegate = Delegate(
        "investigate",
        "Investigate.",
        llm=FunctionLLM(child_play, model="child"),
        config=AgentConfig(name="investigate", control_tools=False, max_iterations=10),
        tools=[tick],
        budget=ContextConfig(max_tokens=3000, counter="approx"),
    )
    store = CrashingStore()
    info = await store.create(agent="durable")
    runtime = Runtime(
        store=store,
        config=CONFIG,
        llm_factory=lambda _config: (FunctionLLM(parent, model="parent"), None),
        tools_factory=lambda _config: ToolExecutor([delegate]),
        cancel_check_seconds=0.0,
        status=status,
    )
    request = RunRequest(session_id=info.id, message="go", run_id="cancelled")
    outcome = await _execute(runtime, request)
    assert outcome.stop_reason == StopReason.CANCELLED
    # Turns before the one that reached `flip_after` ran whole; the next call was not made.
    turns = math.ceil(flip_after / width)
    assert len(child_calls) == turns
    assert flip_after <= len(ticks) <= turns * width
    assert (await store.load(info.id)).info.status == "cancelled"
    events = await store.events(info.id, run_id="cancelled")
    assert [e.stop_reason for e in events if isinstance(e, RunFinished)] == [StopReason.CANCELLED]


async def test_cancelling_a_durable_run_stops_a_grandchild_too() -> None:
    ticks: list[int] = []

    @tool
    async def tick() -> str:
        """Tick once."""
        ticks.append(len(ticks) + 1)
        return "ticked"

    def grandchild_play(request: LLMRequest) -> Reply:
        return reply(tool_calls=[call("tick")])  # ticks until stopped

    def delegating(name: str) -> Callable[[LLMRequest], Reply]:
        def play(request: LLMRequest) -> Reply:
            if any(m.role == "tool" for m in request.messages):
                return reply("done")
            return reply(tool_calls=[call(name, task="tick away")])

        return play

    def delegate(name: str, llm: FunctionLLM, tools: list[Any]) -> Delegate[Any]:
        config = AgentConfig(name=name, control_tools=False, max_iterations=20)
        budget = ContextConfig(max_tokens=3000, counter="approx")
        return Delegate(name, "Delegate.", llm=llm, config=config, tools=tools, budget=budget)

    inner = delegate("inner", FunctionLLM(grandchild_play, model="grandchild"), [tick])
    outer = delegate("outer", FunctionLLM(delegating("inner"), model="child"), [inner])

    async def status(_run_id: str) -> str | None:
        return "CANCELLED" if len(ticks) >= 3 else "PENDING"

    store = CrashingStore()
    info = await store.create(agent="durable")
    runtime = Runtime(
        store=store,
        config=CONFIG,
        llm_factory=lambda _config: (FunctionLLM(delegating("outer"), model="parent"), None),
        tools_factory=lambda _config: ToolExecutor([outer]),
        cancel_check_seconds=0.0,
        status=status,
    )
    outcome = await _execute(runtime, RunRequest(session_id=info.id, message="go", run_id="deep"))
    assert outcome.stop_reason == StopReason.CANCELLED
    assert ticks == [1, 2, 3]  # else it ticks on to its max_iterations: it looked before each


# -- parallel children in a durable run ---------------------------------------------------


async def parallel_attempt(
    store: CrashingStore, runs: list[str], request: RunRequest, *, together: int
) -> Any:
    """One execution of a run whose first step delegates three tasks at once.

    Each child's first model call waits until `together` children are inside one at the same
    time (a bounded wait): children that ran one after another would stop there.
    """
    inside = 0
    all_in = asyncio.Event()

    async def child_play(child_request: LLMRequest) -> Reply:
        nonlocal inside
        task = str(child_request.messages[-1].content)
        runs.append(task)
        inside += 1
        if inside >= together:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), timeout=10)
        return reply(f"answer to {task}")

    def parent(request: LLMRequest) -> Reply:
        if request.messages[-1].role == "tool":
            return reply("done")
        return reply(tool_calls=[call("investigate", task=f"part {n}") for n in (1, 2, 3)])

    delegate = Delegate(
        "investigate",
        "Investigate.",
        llm=FunctionLLM(child_play, model="child"),
        budget=ContextConfig(max_tokens=3000, counter="approx"),
    )
    return await execute(store, request, FunctionLLM(parent, model="parent"), [delegate])


async def test_children_of_one_durable_step_run_side_by_side_and_recover_at_any_write() -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    runs: list[str] = []
    request = RunRequest(session_id=info.id, message="go", run_id="p")
    outcome = await parallel_attempt(store, runs, request, together=3)
    assert outcome is not None and outcome.final_text == "done"
    assert sorted(runs) == ["part 1", "part 2", "part 3"]
    assert [u.content for u in outcome.tool_uses] == [f"answer to part {n}" for n in (1, 2, 3)]
    total = store.writes
    for crash_at in range(1, total + 1):
        store = CrashingStore()
        info = await store.create(agent="durable")
        request = RunRequest(session_id=info.id, message="go", run_id=f"p{crash_at}")
        runs = []
        store.crash_at = crash_at
        await parallel_attempt(store, runs, request, together=3)
        store.crash_at = None
        # The recovery: the children that finished before the crash are replayed, not run.
        outcome = await parallel_attempt(store, runs, request, together=1)
        assert outcome is not None and outcome.final_text == "done", crash_at
        assert len(outcome.tool_uses) == 3, crash_at
        for n, use in enumerate(outcome.tool_uses, start=1):
            # Never twice: a child runs only after its start is stored, and a stored start
            # without a result is "interrupted" in the recovery (the delegate is not idempotent).
            assert runs.count(f"part {n}") <= 1, (crash_at, runs)
            if use.error_kind == "interrupted":
                continue  # started, not recorded: not run again (the delegate is not idempotent)
            assert use.content == f"answer to part {n}", (crash_at, use)


# -- a child that took numbers, its call leaving no result of the child's ------------------


def failing_parent(request: LLMRequest) -> Reply:
    done = sum(1 for m in request.messages if m.role == "tool")
    if done == 0:
        return reply(tool_calls=[call("investigate", task="slow question")])
    if done == 1:
        return reply(tool_calls=[call("noop")])
    return reply("done")


@tool(policy=ToolPolicy(read_only=True))
def echo(text: str) -> str:
    """Echo a text.

    Args:
        text: What to echo.
    """
    return text


@tool(policy=ToolPolicy(read_only=True))
def noop() -> str:
    """Do nothing."""
    return "ok"


class FailingAfterItsChild(Delegate[Any]):
    """A delegate whose child runs (and publishes) to its end, then the call fails."""

    async def run(self, arguments: Any, context: Any) -> Any:
        await super().run(arguments, context)
        raise RuntimeError("the call failed after its child ran")


async def failing_attempt(store: CrashingStore, request: RunRequest) -> Any:
    """A run whose delegate publishes events, then fails: its result carries no child's."""

    def child_play(child_request: LLMRequest) -> Reply:
        if sum(1 for m in child_request.messages if m.role == "tool") < 6:
            return reply(tool_calls=[call("echo", text="x")])
        return reply("found nothing")

    delegate = FailingAfterItsChild(
        "investigate",
        "Investigate.",
        llm=FunctionLLM(child_play, model="child"),
        tools=[echo],
        budget=ContextConfig(max_tokens=3000, counter="approx"),
        read_only=True,
    )
    return await execute(
        store, request, FunctionLLM(failing_parent, model="parent"), [delegate, noop]
    )


async def test_a_recovery_after_a_failed_delegation_stores_the_rest_of_the_run() -> None:
    store = CrashingStore()
    info = await store.create(agent="durable")
    outcome = await failing_attempt(store, RunRequest(session_id=info.id, message="go", run_id="t"))
    assert outcome is not None and outcome.final_text == "done"
    assert [u.is_error for u in outcome.tool_uses] == [True, False], outcome.tool_uses
    clean = [e.kind for e in await store.events(info.id) if not e.path]
    total = store.writes
    for crash_at in range(1, total + 1):
        store = CrashingStore()
        info = await store.create(agent="durable")
        request = RunRequest(session_id=info.id, message="go", run_id=f"t{crash_at}")
        store.crash_at = crash_at
        await failing_attempt(store, request)
        store.crash_at = None
        outcome = await failing_attempt(store, request)
        assert outcome is not None and outcome.final_text == "done", crash_at
        events = await store.events(info.id)
        top = [e for e in events if not e.path]
        assert [e.kind for e in top] == clean, crash_at  # nothing of the run lost
        assert (await store.info(info.id)).status == "completed", crash_at
        seqs = [e.seq for e in events]
        assert seqs == sorted(set(seqs)), crash_at
