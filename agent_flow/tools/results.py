"""What a tool call produces: `ToolResult`, its attachments and loop-control signals.

A `ToolResult` has two audiences. `content` is the text the model reads (the executor may
truncate it to a token limit); `data` is the structured value result handlers turn into
Environment changes, always complete. `is_error` with an `error_kind` tells both the model and
the loop what went wrong.

Loop-control tools (``task_completion``, ``ask_question``, ``converse``, ``update_plan``) put a
`ControlSignal` in `ToolResult.control`; the agent loop recognises it by its ``kind`` and
decides whether to stop (`ControlSignal.ends_loop`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agent_flow._types import JsonObject, JsonValue
from agent_flow._unicode import is_clean, json_is_clean, mend_json
from agent_flow.environment import PlanStep

__all__ = [
    "CONTROL_SIGNAL_ADAPTER",
    "Attachment",
    "ControlSignal",
    "ConverseMessage",
    "ErrorKind",
    "OutputCheck",
    "PlanUpdate",
    "TaskCompletion",
    "ToolResult",
    "UserQuestion",
    "mended",
]

#: Why a result is an error. ``"reported"`` means the tool itself returned an error result
#: (it ran and says it failed); every other kind means the call could not run to completion.
ErrorKind: TypeAlias = Literal[
    "invalid_json",
    "unknown_tool",
    "invalid_arguments",
    "denied",
    "not_approved",
    "timeout",
    "tool_error",
    "exception",
    "mcp_error",
    "server_unavailable",
    "interrupted",
    "reported",
]


class Attachment(BaseModel):
    """Non-text content of a result (an image, audio, a binary resource, a resource link).

    The model sees only `description`; `data` (base64) is kept for handlers and user
    interfaces and never pasted into a prompt.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["image", "audio", "resource", "resource_link"]
    description: str
    mime_type: str | None = None
    uri: str | None = None
    size_bytes: int | None = None
    data: str | None = None


class TaskCompletion(BaseModel):
    """The model declares the task done; the loop stops and reports `summary`.

    With `problem` set, the result did not match the run's output schema: the model was told
    so in the call's own (error) result, and the loop counts a correction instead of stopping
    (or ends the run as ``output_invalid`` once the corrections are used up).
    """

    model_config = ConfigDict(frozen=True)
    ends_loop: ClassVar[bool] = True

    kind: Literal["task_completion"] = "task_completion"
    summary: str
    result: JsonValue = None
    problem: str | None = None


@dataclass(frozen=True)
class OutputCheck:
    """What a run's final result must match, for ``task_completion`` to check when called.

    The agent passes one to `ToolExecutor.execute` when it has an output schema, so that a
    result that does not match is refused in the call's own result: one consistent message to
    the model, never "Task marked as complete." followed by a correction.

    Attributes:
        schema: The result's JSON schema (the model is offered it as ``result``'s schema).
        problem: What is wrong with a ``(result, summary)`` pair, or None when it matches.
    """

    schema: JsonObject
    problem: Callable[[JsonValue, str], str | None]


class UserQuestion(BaseModel):
    """The model needs an answer from the user; the loop stops and asks `question`."""

    model_config = ConfigDict(frozen=True)
    ends_loop: ClassVar[bool] = True

    kind: Literal["ask_question"] = "ask_question"
    question: str
    options: tuple[str, ...] = ()


class ConverseMessage(BaseModel):
    """The model answers conversationally; the loop stops and shows `message`."""

    model_config = ConfigDict(frozen=True)
    ends_loop: ClassVar[bool] = True

    kind: Literal["converse"] = "converse"
    message: str


class PlanUpdate(BaseModel):
    """The plan in ``environment.task`` was replaced; the loop emits a plan event and goes on."""

    model_config = ConfigDict(frozen=True)
    ends_loop: ClassVar[bool] = False

    kind: Literal["plan_update"] = "plan_update"
    plan: tuple[PlanStep, ...]
    current_step: str | None = None


ControlSignal: TypeAlias = Annotated[
    TaskCompletion | UserQuestion | ConverseMessage | PlanUpdate,
    Field(discriminator="kind"),
]
CONTROL_SIGNAL_ADAPTER: TypeAdapter[ControlSignal] = TypeAdapter(ControlSignal)


class ToolResult(BaseModel):
    """The result of one tool call.

    Tools may return one directly (to set `data`, `is_error` or `control` themselves); the
    executor fills in the call id, the tool name and the metadata.

    Attributes:
        content: What the model reads.
        data: Structured data for result handlers (complete even when `content` is truncated).
        is_error: Whether the call failed.
        error_kind: Why it failed (``None`` when it did not).
        control: A loop-control signal, from the loop-control tools.
        attachments: Images, audio and resources, described in `content`, kept here.
        call_id: The id of the call this result answers.
        tool_name: The registered name of the tool.
        duration_seconds: How long the tool ran (approval waits not included).
        truncated: Whether `content` was cut to the output limit.
        original_tokens: Tokens of the full content, when it was counted.
    """

    model_config = ConfigDict(frozen=True)

    content: str
    data: JsonValue = None
    is_error: bool = False
    error_kind: ErrorKind | None = None
    control: ControlSignal | None = None
    attachments: tuple[Attachment, ...] = ()
    call_id: str = ""
    tool_name: str = ""
    duration_seconds: float = 0.0
    truncated: bool = False
    original_tokens: int | None = None

    @classmethod
    def error(
        cls, message: str, *, kind: ErrorKind = "reported", data: JsonValue = None
    ) -> ToolResult:
        """Build an error result the model can read and act on.

        Args:
            message: What went wrong and, ideally, what to do instead.
            kind: Why the call failed; tools reporting their own failure keep ``"reported"``.
            data: Optional structured details for handlers.
        """
        return cls(content=message, data=data, is_error=True, error_kind=kind)

    @property
    def failed(self) -> bool:
        """Whether the call could not run to completion (not merely a tool reporting an error)."""
        return self.is_error and self.error_kind != "reported"


def mended(result: ToolResult) -> ToolResult:
    """`result` with every text in it mended (`agent_flow._unicode`), else `result` itself.

    A tool may return text no UTF-8 encoder takes (a file name listed with
    ``surrogateescape``, a lone half of an emoji from JSON it read): as it is, no event, entry
    or store could write it.
    """
    clean = is_clean(result.content) and json_is_clean(result.data)
    if clean and (result.control is not None or result.attachments):
        clean = json_is_clean(result.model_dump(mode="json", include={"control", "attachments"}))
    if clean:
        return result
    return ToolResult.model_validate(mend_json(result.model_dump(mode="json")))
