"""What a run's user message does to the environment's task (``/task``), before the run starts.

`set_task` is the one place a run moves ``/task/objective`` and ``/task/status``: a follow-up
(`AgentExecutor.send`) takes a waiting task back up; a new task (`AgentExecutor.run`) replaces
the objective and clears the previous task's plan, unless the task was prepared for it.
`take_up_unstarted` does the same for a session resumed before its first step was saved, and
`resumed_state` gives a stored session's history and environment to rebuild an agent from.
`settle_task` is what the run's end does to ``/task/status`` (`TASK_STATUS_AFTER`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_flow.agent.outcome import StopReason
from agent_flow.config import AgentConfig
from agent_flow.environment import Environment, TaskStatus
from agent_flow.history import History, UserMessage

if TYPE_CHECKING:
    from agent_flow.sessions.models import SessionState

__all__ = ["TASK_STATUS_AFTER", "resumed_state", "set_task", "settle_task", "take_up_unstarted"]

#: ``/task/status`` after a run that stopped for each reason: the session's status
#: (`agent_flow.sessions.recorder.session_status`) in the task's words. A cancelled or
#: interrupted run leaves the task as it was (``in_progress``: its work was cut short, a
#: follow-up goes on with it).
TASK_STATUS_AFTER: dict[StopReason, TaskStatus | None] = {
    StopReason.COMPLETED: TaskStatus.COMPLETED,
    StopReason.ANSWERED: TaskStatus.COMPLETED,
    StopReason.CONVERSE: TaskStatus.COMPLETED,
    StopReason.WAITING_FOR_USER: TaskStatus.WAITING,
    StopReason.DEFERRED: TaskStatus.WAITING,
    StopReason.MAX_ITERATIONS: TaskStatus.FAILED,
    StopReason.TOKEN_LIMIT: TaskStatus.FAILED,
    StopReason.COST_LIMIT: TaskStatus.FAILED,
    StopReason.CONTEXT_BUDGET: TaskStatus.FAILED,
    StopReason.STUCK: TaskStatus.FAILED,
    StopReason.OUTPUT_INVALID: TaskStatus.FAILED,
    StopReason.ERROR: TaskStatus.FAILED,
    StopReason.CANCELLED: None,
    StopReason.INTERRUPTED: None,
}


def settle_task(environment: Environment, reason: StopReason) -> bool:
    """Set ``/task/status`` as a run that stopped for `reason` leaves it; True if it changed."""
    status = TASK_STATUS_AFTER[reason]
    if status is None or environment.task.status is status:
        return False
    environment.update_section("task", status=status.value)
    return True


def resumed_state(state: SessionState, config: AgentConfig) -> tuple[History, Environment]:
    """The history and environment an agent of `config` resumes the stored `state` with.

    Plain CPU work (decoding, token counts): a server runs it off its event loop.
    """
    from agent_flow.agent._build import counter_for

    history = state.history(counter=counter_for(config))
    environment = state.environment if state.environment is not None else Environment()
    if state.info.task and not state.entries:
        take_up_unstarted(environment, history, state.info.task)
    return history, environment


def set_task(environment: Environment, history: History, objective: str | None) -> None:
    """Move ``/task`` for a run on a new task `objective` (None: a follow-up message)."""
    task = environment.task
    if objective is None:
        # A follow-up takes the task up again, however the last run left it.
        if task.status is not TaskStatus.IN_PROGRESS:
            environment.update_section("task", status=TaskStatus.IN_PROGRESS.value)
        return
    prepared = task.objective != "" and len(history) == 0
    if prepared or objective == task.objective:
        if task.status is not TaskStatus.IN_PROGRESS:
            environment.update_section("task", status=TaskStatus.IN_PROGRESS.value)
        return
    # A new task: the plan made for the previous one no longer applies.
    environment.update_section(
        "task",
        objective=objective,
        status=TaskStatus.IN_PROGRESS.value,
        plan=[],
        steps_total=0,
        steps_completed=0,
        current_step=None,
    )


def take_up_unstarted(environment: Environment, history: History, task: str) -> None:
    """Resume a session stopped before its first step was saved with the `task` it was made for.

    The task becomes the first message, and the objective unless one was set.
    """
    history.add(UserMessage(content=task))
    if environment.task.objective == "":
        environment.update_section("task", objective=task, status=TaskStatus.IN_PROGRESS.value)
