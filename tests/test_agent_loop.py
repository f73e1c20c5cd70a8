"""How a run starts and ends (agent/_loop.py, executor run/send/cancel): each test failed on
the loop as it was before and names what was wrong.

Covered: agents sharing one `EventBus`, a second `run` and `send` after a question, a failing
store, cancelling before the run's task ran, and cancellations that meet each other or the end
of a run. Nothing sleeps to synchronize: tests wait on events, and hangs are bounded with
``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow.agent import AgentExecutor, StopReason
from agent_flow.agent._task import TASK_STATUS_AFTER, set_task, settle_task
from agent_flow.config import AgentConfig, ContextConfig
from agent_flow.environment import Environment, TaskStatus
from agent_flow.errors import StoreError, UserError
from agent_flow.events import AgentEvent, EnvironmentUpdated, EventBus, Subscription
from agent_flow.history import History, ToolCallEntry, ToolResultEntry
from agent_flow.llm.base import LLMRequest
from agent_flow.sessions import InMemorySessionStore, SessionStatus
from agent_flow.sessions.recorder import session_status
from agent_flow.testing import FunctionLLM, Reply, ScriptedLLM, call, reply
from agent_flow.tools import tool


def make_agent(llm: Any, **kwargs: Any) -> AgentExecutor:
    config = kwargs.pop("config", None) or AgentConfig(
        context=ContextConfig(max_tokens=8000, counter="approx")
    )
    return AgentExecutor(llm, config=config, **kwargs)


def assert_history_consistent(agent: AgentExecutor) -> None:
    calls = {e.call_id for e in agent.history.entries if isinstance(e, ToolCallEntry)}
    results = {e.call_id for e in agent.history.entries if isinstance(e, ToolResultEntry)}
    assert calls == results
    assert agent.history.pending_calls() == []


def collect(subscription: Subscription) -> asyncio.Task[list[AgentEvent]]:
    async def read() -> list[AgentEvent]:
        return [event async for event in subscription]

    return asyncio.create_task(read())


async def bounded(task: asyncio.Task[list[AgentEvent]]) -> list[AgentEvent]:
    async with asyncio.timeout(10):
        return await task


def completion(summary: str, result: Any = None) -> Reply:
    arguments: dict[str, Any] = {"summary": summary}
    if result is not None:
        arguments["result"] = result
    return reply(tool_calls=[call("task_completion", arguments)])


class GatedStore(InMemorySessionStore):
    """Holds the save of one kind (a step, or a run's end) at a gate; may fail saves."""

    def __init__(self, *, hold: str | None = None, fail: str | None = None) -> None:
        super().__init__()
        self.hold, self.fail = hold, fail
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def save_step(self, session_id: str, **kwargs: Any) -> Any:
        kind = "step" if kwargs.get("status") == "active" else "end"
        if self.fail in (kind, "any"):
            raise StoreError(f"cannot write session {session_id!r}: the disk is full")
        if self.hold == kind and not self.gate.is_set():
            self.entered.set()
            await self.gate.wait()
        return await super().save_step(session_id, **kwargs)


async def status_of(agent: AgentExecutor, store: InMemorySessionStore) -> SessionStatus:
    assert agent.session_id is not None
    return (await store.info(agent.session_id)).status


# -- 4. agents sharing one bus ------------------------------------------------------------------


async def test_one_agent_finishing_does_not_close_a_bus_shared_with_another() -> None:
    """agent/_loop.py `_finish` closed ``agent.events`` whoever made it: the first agent to
    finish ended every subscription on the shared bus, so the second agent's events after
    that reached nobody.
    """
    bus = EventBus()
    second_started = asyncio.Event()
    release_second = asyncio.Event()

    async def slow_second(request: LLMRequest) -> Reply:
        second_started.set()
        await release_second.wait()
        return "second done"

    first = make_agent(ScriptedLLM(["first done"]), bus=bus)
    second = make_agent(FunctionLLM(slow_second), bus=bus)
    everything = collect(bus.subscribe())
    only_first = collect(first.subscribe())
    only_second = collect(second.subscribe())

    running = asyncio.create_task(second.run("two"))
    await second_started.wait()
    assert (await first.run("one")).final_text == "first done"
    first_events = await bounded(only_first)  # the first agent's own subscription ended
    release_second.set()
    assert (await running).final_text == "second done"
    second_events = await bounded(only_second)

    assert not everything.done()  # nobody but the bus's creator closes it
    bus.close()
    seen = await bounded(everything)
    finished = [e for e in seen if e.kind == "run_finished"]
    assert [getattr(e, "final_text", None) for e in finished] == ["first done", "second done"]
    # An agent's subscription sees that agent's events only, and all of them.
    assert {e.run_id for e in first_events} == {finished[0].run_id}
    assert {e.run_id for e in second_events} == {finished[1].run_id}
    assert len(first_events) + len(second_events) == len(seen)
    assert second_events[-1].kind == "run_finished"


async def test_an_agent_with_its_own_bus_still_ends_every_subscription_when_a_run_ends() -> None:
    agent = make_agent(ScriptedLLM(["done"]))
    direct = collect(agent.events.subscribe())
    scoped = collect(agent.subscribe())
    await agent.run("go")
    assert (await bounded(direct))[-1].kind == "run_finished"
    assert (await bounded(scoped))[-1].kind == "run_finished"


# -- 5. a second run, and send after a question ----------------------------------------------------


async def test_a_second_run_sets_the_new_objective_and_resets_the_status_and_plan() -> None:
    """executor.py `run` set the objective only when it was empty: a second task kept the first
    task's objective, its "completed" status and its plan.
    """
    seen: list[tuple[str, TaskStatus, int]] = []
    replies = iter(
        [
            reply(tool_calls=[call("update_plan", steps=[{"description": "count"}])]),
            completion("first done"),
            "second answer",
        ]
    )

    def model(request: LLMRequest) -> Reply:
        task = agent.environment.task
        seen.append((task.objective, task.status, len(task.plan)))
        return next(replies)

    agent = make_agent(FunctionLLM(model))
    await agent.run("first task")
    assert agent.environment.task.status is TaskStatus.COMPLETED
    await agent.run("second task")
    assert seen[-1] == ("second task", TaskStatus.IN_PROGRESS, 0)


async def test_a_first_run_keeps_an_objective_the_environment_was_prepared_with() -> None:
    agent = make_agent(ScriptedLLM(["ok"]))
    agent.environment.update_section("task", objective="Analyze sales", steps_total=3)
    await agent.run("Please analyze sales_data.csv")
    task = agent.environment.task
    # The answered run completed the task (`TASK_STATUS_AFTER`).
    assert (task.objective, task.status, task.steps_total) == (
        "Analyze sales",
        TaskStatus.COMPLETED,
        3,
    )


async def test_send_after_ask_question_moves_the_status_out_of_waiting() -> None:
    """executor.py `send` left the status "waiting" while the agent worked on the answer."""
    statuses: list[TaskStatus] = []
    replies = iter([reply(tool_calls=[call("ask_question", question="Which file?")]), "ok"])

    def model(request: LLMRequest) -> Reply:
        statuses.append(agent.environment.task.status)
        return next(replies)

    agent = make_agent(FunctionLLM(model))
    outcome = await agent.run("fix it")
    assert outcome.stop_reason is StopReason.WAITING_FOR_USER
    assert agent.environment.task.status is TaskStatus.WAITING
    await agent.send("parser.py")
    assert statuses == [TaskStatus.IN_PROGRESS, TaskStatus.IN_PROGRESS]


# -- 8. a failing store ---------------------------------------------------------------------------


@pytest.mark.parametrize("fail", ["end", "any"])
async def test_a_store_that_fails_gives_an_error_outcome_with_the_cause(fail: str) -> None:
    """agent/_loop.py `_finish` saved the end outside any handler: a store failure there
    escaped `run` as an exception, and the outcome (and its answer) was lost.
    """
    store = GatedStore(fail=fail)
    agent = make_agent(
        ScriptedLLM([reply(tool_calls=[call("update_plan", steps=[{"description": "a"}])]), "ok"]),
        store=store,
    )
    events = collect(agent.subscribe())
    outcome = await agent.run("go")
    assert outcome.stop_reason is StopReason.ERROR
    assert outcome.errors[-1].type == "StoreError"
    assert "the disk is full" in outcome.errors[-1].message
    assert outcome.errors[-1].fatal
    if fail == "end":
        assert outcome.final_text == "ok"  # what the run achieved is kept
    seen = await bounded(events)
    kinds = [e.kind for e in seen if e.kind != "environment_updated"]
    assert kinds[-2:] == ["execution_error", "run_finished"]
    # The run's end said what it did to the task: failed, with the run.
    (last,) = [e for e in seen if isinstance(e, EnvironmentUpdated)][-1:]
    assert last.source == "run_finished" and last.changes[-1].new == "failed"
    assert agent.environment.task.status is TaskStatus.FAILED
    assert [e.seq for e in seen] == list(range(len(seen)))
    assert getattr(seen[-1], "stop_reason", None) == "error"
    # The agent is usable again, and its next save carries what the failed one could not.
    store.fail = None
    agent.llm = ScriptedLLM(["again"])
    await agent.send("retry")
    assert agent.session_id is not None
    stored = await store.events(agent.session_id)
    assert [e.kind for e in stored].count("run_finished") == 2


# -- 9. cancel before the run's task ran -----------------------------------------------------------


async def test_cancel_right_after_create_task_cancels_the_run() -> None:
    """executor.py `cancel` did nothing while `_run` was unset, and `_run` was set only once
    the task ran: the run started anyway and called the model.
    """
    llm = ScriptedLLM(["should not be asked"])
    agent = make_agent(llm)
    running = asyncio.create_task(agent.run("go"))
    agent.cancel()
    outcome = await running
    assert outcome.stop_reason is StopReason.CANCELLED
    assert llm.requests == []
    assert running.cancelling() == 0
    assert (await agent.send("now go")).final_text == "should not be asked"


async def test_a_run_claimed_twice_is_refused_when_called_and_a_dropped_one_frees_the_agent() -> (
    None
):
    agent = make_agent(ScriptedLLM(["one", "two"]))
    first = agent.run("go")
    with pytest.raises(UserError, match="already running"):
        agent.run("again")
    first.close()  # never awaited
    assert (await agent.run("go")).final_text == "one"


async def test_a_run_whose_task_was_cancelled_before_it_ran_frees_the_agent() -> None:
    llm = ScriptedLLM(["answer"])
    agent = make_agent(llm)
    running = asyncio.create_task(agent.run("go"))
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert llm.requests == []
    assert (await agent.run("go")).final_text == "answer"


async def test_cancel_from_a_hook_of_the_runs_own_task_ends_the_run_and_not_the_caller() -> None:
    """agent/_loop.py `execute`: a `cancel()` made inside the run's task (a hook) just before
    the loop ended without another await was never delivered to the run: `run` returned
    ANSWERED and the CancelledError hit the caller at its next await.
    """
    agent = make_agent(ScriptedLLM(["done"]))
    agent.events.on("model_responded", lambda event: agent.cancel())

    async def run_then_await() -> tuple[StopReason, int]:
        outcome = await agent.run("go")
        await asyncio.sleep(0)  # a cancellation left pending would land here
        task = asyncio.current_task()
        assert task is not None
        return outcome.stop_reason, task.cancelling()

    assert await asyncio.create_task(run_then_await()) == (StopReason.CANCELLED, 0)


# -- cancellations that meet each other or the end of a run --------------------------------------


def hanging_agent(**kwargs: Any) -> tuple[AgentExecutor, asyncio.Event]:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "impossible"

    agent = make_agent(ScriptedLLM([reply(tool_calls=[call("wait_forever")])]), **kwargs)
    agent.tools.register(wait_forever)
    return agent, started


@pytest.mark.parametrize("agent_first", [True, False])
async def test_an_outside_cancel_that_meets_agent_cancel_still_reaches_the_outside(
    agent_first: bool,
) -> None:
    """agent/_loop.py `execute`: with `cancel()` requested, the CancelledError was taken as
    the agent's own and swallowed (one ``uncancel``): an outside ``task.cancel()`` arriving at
    the same time was lost, and the canceller got an outcome instead of a cancelled task.
    """
    store = InMemorySessionStore()
    agent, started = hanging_agent(store=store)
    running = asyncio.create_task(agent.run("hang"))
    await started.wait()
    if agent_first:
        agent.cancel()
        running.cancel()
    else:
        running.cancel()
        agent.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert_history_consistent(agent)
    assert await status_of(agent, store) == "cancelled"


async def test_a_cancel_while_the_end_is_saved_does_not_leave_the_session_active() -> None:
    """agent/_loop.py `_finish`: a cancellation delivered while the final save waited in the
    store interrupted it, and the session stayed "active" for good.
    """
    store = GatedStore(hold="end")
    agent = make_agent(ScriptedLLM(["done"]), store=store)
    events = collect(agent.subscribe())
    running = asyncio.create_task(agent.run("go"))
    await store.entered.wait()
    running.cancel()
    agent.cancel()  # ignored: the run is finishing
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert await status_of(agent, store) == "completed"
    seen = await bounded(events)
    assert seen[-1].kind == "run_finished"
    assert agent.session_id is not None
    assert [e.seq for e in await store.events(agent.session_id)] == [e.seq for e in seen]


async def test_a_step_save_held_up_by_a_cancel_loses_none_of_the_steps_events() -> None:
    """agent/_loop.py `_save` took the pending events before the write; a cancel while the
    write waited dropped both, so the stored session lacked that step's events.
    """
    store = GatedStore(hold="step")
    agent = make_agent(
        ScriptedLLM([reply(tool_calls=[call("update_plan", steps=[{"description": "a"}])])]),
        store=store,
    )
    events = collect(agent.subscribe())
    running = asyncio.create_task(agent.run("go"))
    await store.entered.wait()
    agent.cancel()
    store.gate.set()
    assert (await running).stop_reason is StopReason.CANCELLED
    seen = await bounded(events)
    assert agent.session_id is not None
    stored = await store.events(agent.session_id)
    assert [(e.seq, e.kind) for e in stored] == [(e.seq, e.kind) for e in seen]
    assert "tool_call_completed" in {e.kind for e in stored}
    assert await status_of(agent, store) == "cancelled"
    state = await store.load(agent.session_id)
    assert state.entries == tuple(agent.history.entries)


@given(
    reasons=st.lists(st.sampled_from(list(StopReason)), min_size=1, max_size=6),
    start=st.sampled_from(list(TaskStatus)),
)
def test_a_runs_end_sets_the_task_status_and_a_follow_up_takes_it_up_again(
    reasons: list[StopReason], start: TaskStatus
) -> None:
    environment = Environment()
    environment.update_section("task", objective="t", status=start.value)
    for reason in reasons:
        before = environment.task.status
        changed = settle_task(environment, reason)
        after = TASK_STATUS_AFTER[reason]
        assert environment.task.status is (before if after is None else after)
        assert changed == (after is not None and after is not before)
        # Whatever the end, the session's status and the task's say the same.
        assert after is None or session_status(reason) == after.value
        set_task(environment, History(), None)  # a follow-up message
        assert environment.task.status is TaskStatus.IN_PROGRESS


async def test_an_answered_run_completes_the_task_and_says_so_in_an_event() -> None:
    agent = make_agent(ScriptedLLM(["ok", "again"]))
    seen: list[str] = []
    subscription = agent.subscribe()

    async def watch() -> None:
        async for event in subscription:
            if isinstance(event, EnvironmentUpdated) and event.source == "run_finished":
                seen.extend(change.pointer for change in event.changes)

    watcher = asyncio.create_task(watch())
    outcome = await agent.run("fix it")
    assert outcome.stop_reason is StopReason.ANSWERED
    assert agent.environment.task.status is TaskStatus.COMPLETED
    await agent.send("and this")
    assert agent.environment.task.status is TaskStatus.COMPLETED
    await agent.aclose()
    await watcher
    assert seen and all(pointer.startswith("/task") for pointer in seen)
