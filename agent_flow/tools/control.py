"""Loop-control tools and the plan tool.

The model ends a run by calling one of three tools rather than by merely stopping:

- ``task_completion(summary, result?)`` — the task is done; when the run has an output
  schema, the model is offered that schema for ``result`` (`with_result_schema`) and a result
  that does not match is refused in the call's own result (`OutputCheck`), so the model gets
  one consistent message;
- ``ask_question(question, options?)`` — the model needs the user's answer;
- ``converse(message)`` — the model answers conversationally.

Each returns a `ToolResult` whose ``control`` is a `TaskCompletion`, `UserQuestion` or
`ConverseMessage`; the agent loop recognises the signal and stops (these tools only describe
what happened, the loop decides).

``update_plan(steps)`` replaces the plan in ``environment.task`` (and keeps
``steps_total``, ``steps_completed``, ``current_step`` and the status in step) and returns a
`PlanUpdate` signal so the loop can emit a plan event; it does not stop the loop.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment import PlanStep, TaskStatus
from agent_flow.errors import ToolError
from agent_flow.messages import ToolDefinition
from agent_flow.tools.base import Tool, ToolContext, tool
from agent_flow.tools.policy import ToolPolicy
from agent_flow.tools.results import (
    ConverseMessage,
    PlanUpdate,
    TaskCompletion,
    ToolResult,
    UserQuestion,
)

__all__ = [
    "CONTROL_TOOL_NAMES",
    "PlanStepInput",
    "ask_question",
    "control_tools",
    "converse",
    "task_completion",
    "update_plan",
    "with_result_schema",
]

_CONTROL = ToolPolicy(read_only=True)


@tool(policy=_CONTROL, blocking=False)
def task_completion(summary: str, context: ToolContext, result: JsonValue = None) -> ToolResult:
    """Finish the task and present the outcome to the user. Call this only when done.

    Args:
        summary: What was done and what came out of it, for the user.
        context: Supplied by the executor, not by the model.
        result: Optional structured result (any JSON value).
    """
    check = context.output
    problem = check.problem(result, summary) if check is not None else None
    if check is not None and problem is not None:
        return ToolResult(
            content=(
                "Not complete: the result of your task_completion call does not match the "
                f"required output schema: {problem}\nCall task_completion again with a result "
                f"that matches this schema:\n{json.dumps(check.schema)}"
            ),
            is_error=True,
            error_kind="reported",
            data={"summary": summary, "result": result, "problem": problem},
            control=TaskCompletion(summary=summary, result=result, problem=problem),
        )
    return ToolResult(
        content="Task marked as complete.",
        data={"summary": summary, "result": result},
        control=TaskCompletion(summary=summary, result=result),
    )


def with_result_schema(definition: ToolDefinition, schema: JsonObject) -> ToolDefinition:
    """``task_completion``'s definition with `schema` as its ``result``, now required.

    The schema's own definitions (``$defs``, which its ``$ref`` pointers name from its root)
    move to the root of the parameters, where those pointers still lead.
    """
    body = dict(schema)
    defs = body.pop("$defs", None)
    description = "The task's result, as JSON matching this schema."
    if isinstance(body.get("description"), str):
        description += f" {body['description']}"
    parameters: JsonObject = dict(definition.parameters)
    properties = parameters.get("properties")
    parameters["properties"] = {
        **(properties if isinstance(properties, dict) else {}),
        "result": {**body, "description": description},
    }
    required = parameters.get("required")
    names: list[JsonValue] = [str(r) for r in required] if isinstance(required, list) else []
    parameters["required"] = names if "result" in names else [*names, "result"]
    # The definitions of the old `result` (any JSON) give way to those of the schema.
    parameters.pop("$defs", None)
    if isinstance(defs, dict):
        parameters["$defs"] = defs
    return definition.model_copy(update={"parameters": parameters})


@tool(policy=_CONTROL, blocking=False)
def ask_question(question: str, options: list[str] | None = None) -> ToolResult:
    """Stop and ask the user a question whose answer you need to go on.

    Args:
        question: The question, self-contained.
        options: Suggested answers, if the choice is between a few.
    """
    choices = tuple(options or ())
    return ToolResult(
        content="Question sent to the user; wait for the answer.",
        data={"question": question, "options": list(choices)},
        control=UserQuestion(question=question, options=choices),
    )


@tool(policy=_CONTROL, blocking=False)
def converse(message: str) -> ToolResult:
    """Reply to the user conversationally when no task work is needed.

    Args:
        message: The reply.
    """
    return ToolResult(
        content="Message sent to the user.",
        data={"message": message},
        control=ConverseMessage(message=message),
    )


class PlanStepInput(BaseModel):
    """One step of a plan as the model writes it."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(description="What the step does.")
    completed: bool = Field(default=False, description="Whether the step is done.")
    result: str | None = Field(default=None, description="What the step produced, once done.")


@tool(policy=ToolPolicy(read_only=True))
async def update_plan(steps: list[PlanStepInput], context: ToolContext) -> ToolResult:
    """Replace the task plan: send every step, in order, marking the finished ones completed.

    Args:
        steps: All steps of the plan, in order.
        context: Supplied by the executor, not by the model.
    """
    environment = context.environment
    if environment is None:
        raise ToolError("update_plan needs the run's environment, and this run has none")
    if not steps:
        raise ToolError("a plan needs at least one step")
    plan = [
        PlanStep(description=s.description, completed=s.completed, result=s.result) for s in steps
    ]
    done = sum(step.completed for step in plan)
    current = next((step.description for step in plan if not step.completed), None)
    status = environment.task.status
    if status == TaskStatus.NOT_STARTED:
        status = TaskStatus.IN_PROGRESS
    environment.update_section(
        "task",
        plan=[step.model_dump(mode="json") for step in plan],
        steps_total=len(plan),
        steps_completed=done,
        current_step=current,
        status=status.value,
    )
    lines = [f"[{'x' if step.completed else ' '}] {step.description}" for step in plan]
    return ToolResult(
        content=f"Plan updated ({done}/{len(plan)} done):\n" + "\n".join(lines),
        data={"steps_total": len(plan), "steps_completed": done, "current_step": current},
        control=PlanUpdate(plan=tuple(plan), current_step=current),
    )


#: The names of the tools that end the loop.
CONTROL_TOOL_NAMES: frozenset[str] = frozenset({"task_completion", "ask_question", "converse"})


def control_tools(*, plan: bool = True) -> list[Tool]:
    """The loop-control tools, and the plan tool unless ``plan=False``."""
    tools: list[Tool] = [task_completion, ask_question, converse]
    if plan:
        tools.append(update_plan)
    return tools
