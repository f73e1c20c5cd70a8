from __future__ import annotations

import typing

import pytest

from agent_flow.environment import Environment, PlanStep, TaskStatus
from agent_flow.tools import (
    CONTROL_SIGNAL_ADAPTER,
    CONTROL_TOOL_NAMES,
    ControlSignal,
    ConverseMessage,
    PlanUpdate,
    TaskCompletion,
    ToolExecutor,
    ToolOutcome,
    UserQuestion,
    control_tools,
)
from tests.helpers import tool_call as call


@pytest.fixture
def executor() -> ToolExecutor:
    return ToolExecutor(control_tools())


async def test_task_completion_carries_the_summary_and_result(executor: ToolExecutor) -> None:
    outcome = await executor.execute_one(
        call("task_completion", {"summary": "Report written", "result": {"pages": 3}})
    )
    control = outcome.result.control
    assert control == TaskCompletion(summary="Report written", result={"pages": 3})
    assert control.ends_loop
    assert outcome.result.content == "Task marked as complete."


async def test_ask_question_and_converse_end_the_loop_with_their_message(
    executor: ToolExecutor,
) -> None:
    asked, said = await executor.execute(
        [
            call("ask_question", {"question": "Which file?", "options": ["a.py", "b.py"]}, "1"),
            call("converse", {"message": "Hello!"}, "2"),
        ]
    )
    assert asked.result.control == UserQuestion(question="Which file?", options=("a.py", "b.py"))
    assert said.result.control == ConverseMessage(message="Hello!")
    assert asked.result.control.ends_loop
    assert said.result.control.ends_loop


async def test_update_plan_replaces_the_plan_in_the_environment(executor: ToolExecutor) -> None:
    env = Environment()
    steps = [
        {"description": "Explore the project", "completed": True, "result": "found src/"},
        {"description": "Write the parser"},
        {"description": "Test it"},
    ]
    outcome = await executor.execute_one(call("update_plan", {"steps": steps}), environment=env)
    task = env.task
    assert task.plan == [
        PlanStep(description="Explore the project", completed=True, result="found src/"),
        PlanStep(description="Write the parser"),
        PlanStep(description="Test it"),
    ]
    assert (task.steps_total, task.steps_completed, task.current_step, task.status) == (
        3,
        1,
        "Write the parser",
        TaskStatus.IN_PROGRESS,
    )
    control = outcome.result.control
    assert isinstance(control, PlanUpdate)
    assert not control.ends_loop
    assert list(control.plan) == task.plan
    assert control.current_step == "Write the parser"
    assert outcome.result.content == (
        "Plan updated (1/3 done):\n[x] Explore the project\n[ ] Write the parser\n[ ] Test it"
    )
    # the tool wrote through the environment API; handlers skip loop-control results
    assert {c.pointer for c in env.changes()} == {
        "/task/plan",
        "/task/steps_total",
        "/task/steps_completed",
        "/task/current_step",
        "/task/status",
    }
    assert outcome.environment_changes == ()


async def test_update_plan_keeps_a_status_that_was_already_set(executor: ToolExecutor) -> None:
    env = Environment()
    env.update_section("task", status=TaskStatus.WAITING)
    await executor.execute_one(
        call("update_plan", {"steps": [{"description": "a", "completed": True}]}), environment=env
    )
    assert env.task.status == TaskStatus.WAITING
    assert env.task.current_step is None


@pytest.mark.parametrize(
    ("arguments", "environment", "message"),
    [
        ({"steps": [{"description": "a"}]}, False, "needs the run's environment"),
        ({"steps": []}, True, "at least one step"),
    ],
)
async def test_update_plan_errors_are_results_for_the_model(
    executor: ToolExecutor, arguments: object, environment: bool, message: str
) -> None:
    env = Environment() if environment else None
    outcome = await executor.execute_one(call("update_plan", arguments), environment=env)
    assert outcome.result.error_kind == "tool_error"
    assert message in outcome.result.content


def test_control_tools_are_read_only_and_named_as_the_loop_expects() -> None:
    tools = control_tools()
    assert [t.name for t in tools] == ["task_completion", "ask_question", "converse", "update_plan"]
    assert all(t.policy.read_only for t in tools)
    assert {t.name for t in control_tools(plan=False)} == CONTROL_TOOL_NAMES


def test_every_control_signal_is_in_the_union_and_round_trips_through_json() -> None:
    union_members = set(typing.get_args(typing.get_args(ControlSignal)[0]))
    assert union_members == {TaskCompletion, UserQuestion, ConverseMessage, PlanUpdate}
    samples = [
        TaskCompletion(summary="done", result=[1, {"a": None}]),
        UserQuestion(question="why?", options=("a", "b")),
        ConverseMessage(message="hi"),
        PlanUpdate(
            plan=(PlanStep(description="x", completed=True, result="y"),), current_step=None
        ),
    ]
    assert {type(s) for s in samples} == union_members
    for sample in samples:
        text = CONTROL_SIGNAL_ADAPTER.dump_json(sample)
        assert CONTROL_SIGNAL_ADAPTER.validate_json(text) == sample


async def test_outcomes_with_control_signals_round_trip_through_json(
    executor: ToolExecutor,
) -> None:
    outcome = await executor.execute_one(call("ask_question", {"question": "Go on?"}))
    assert ToolOutcome.model_validate_json(outcome.model_dump_json()) == outcome
