"""The environment's sections: their names, typed models, and the record of one change.

The typed sections are `SystemState`, `TaskState` (with `TaskStatus` and the plan's
`PlanStep`), `KnowledgeBase` and `WorkspaceState` (with `FileInfo` and `ArtifactInfo`); all
are frozen and forbid unknown fields. `_State` is the whole state (the four typed sections
plus free ``extensions``), the root type every pointer is resolved against.
`EnvironmentChange` is one entry of an environment's change log.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from agent_flow._types import FrozenModel, JsonObject, JsonValue

__all__ = [
    "RENDER_ORDER",
    "ArtifactInfo",
    "EnvironmentChange",
    "FileInfo",
    "KnowledgeBase",
    "PlanStep",
    "SectionName",
    "SystemState",
    "TaskState",
    "TaskStatus",
    "TypedSectionName",
    "WorkspaceState",
]

SectionName: TypeAlias = Literal["system", "task", "knowledge", "workspace", "extensions"]
TypedSectionName: TypeAlias = Literal["system", "task", "knowledge", "workspace"]

#: The order sections appear in the rendered text.
RENDER_ORDER: Final[tuple[SectionName, ...]] = (
    "system",
    "task",
    "knowledge",
    "workspace",
    "extensions",
)

_SECTION_CONFIG = ConfigDict(frozen=True, extra="forbid")


class TaskStatus(StrEnum):
    """Where the task stands."""

    NOT_STARTED = "not_started"
    IN_PROGRESS = "in_progress"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"


class PlanStep(BaseModel):
    """One step of the task's plan.

    Attributes:
        description: What the step does.
        completed: Whether it is done.
        result: What it produced, once done.
    """

    model_config = _SECTION_CONFIG

    description: str
    completed: bool = False
    result: str | None = None


class SystemState(BaseModel):
    """Facts about the machine the agent runs on.

    Attributes:
        working_directory: The directory the agent works in.
        permissions: What the agent may do (``"read"``, ``"write"``, ...).
        resources: Named limits and resources (``{"memory_limit": "8GB"}``).
    """

    model_config = _SECTION_CONFIG

    working_directory: str = ""
    permissions: list[str] = Field(default_factory=list)
    resources: dict[str, str] = Field(default_factory=dict)


class TaskState(BaseModel):
    """The task and its progress; the plan lives here.

    Attributes:
        objective: What the agent is asked to achieve.
        status: Where the task stands.
        steps_completed: How many steps are done.
        steps_total: How many steps are planned.
        current_step: What the agent is doing now.
        plan: The steps, in order.
    """

    model_config = _SECTION_CONFIG

    objective: str = ""
    status: TaskStatus = TaskStatus.NOT_STARTED
    steps_completed: int = 0
    steps_total: int = 0
    current_step: str | None = None
    plan: list[PlanStep] = Field(default_factory=list)


class KnowledgeBase(BaseModel):
    """What the agent has learned.

    Attributes:
        discovered_facts: Facts, oldest first.
        sources: Where knowledge came from, by name (``{"docs": "https://..."}``).
        key_concepts: Concepts worth keeping in mind.
        extra: Anything else, as JSON.
    """

    model_config = _SECTION_CONFIG

    discovered_facts: list[str] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)
    key_concepts: list[str] = Field(default_factory=list)
    extra: dict[str, JsonValue] = Field(default_factory=dict)


class FileInfo(BaseModel):
    """What the agent knows about one file or directory of the workspace.

    Attributes:
        kind: File or directory.
        size: Size in bytes, when known.
        summary: A short description of the content.
    """

    model_config = _SECTION_CONFIG

    kind: Literal["file", "directory"] = "file"
    size: int | None = None
    summary: str | None = None


class ArtifactInfo(BaseModel):
    """Something the agent produced.

    Attributes:
        name: The artifact's name.
        path: Where it is stored, if it is a file.
        description: What it is.
    """

    model_config = _SECTION_CONFIG

    name: str
    path: str | None = None
    description: str = ""


class WorkspaceState(BaseModel):
    """The files the agent knows about and what it produced.

    Attributes:
        files: By path relative to the workspace root, in the order they were first added.
        artifacts: What the agent produced, oldest first.
        extra: Anything else, as JSON.
    """

    model_config = _SECTION_CONFIG

    files: dict[str, FileInfo] = Field(default_factory=dict)
    artifacts: list[ArtifactInfo] = Field(default_factory=list)
    extra: dict[str, JsonValue] = Field(default_factory=dict)


class _State(BaseModel):
    """The whole state; the root type of every pointer."""

    model_config = _SECTION_CONFIG

    system: SystemState = Field(default_factory=SystemState)
    task: TaskState = Field(default_factory=TaskState)
    knowledge: KnowledgeBase = Field(default_factory=KnowledgeBase)
    workspace: WorkspaceState = Field(default_factory=WorkspaceState)
    extensions: dict[str, JsonValue] = Field(default_factory=dict)


_SECTION_MODELS: Final[dict[str, type[BaseModel]]] = {
    "system": SystemState,
    "task": TaskState,
    "knowledge": KnowledgeBase,
    "workspace": WorkspaceState,
}
_DEFAULT_STATE: Final[JsonObject] = _State().model_dump(mode="json")


class EnvironmentChange(FrozenModel):
    """One recorded change of the environment.

    Attributes:
        version: The environment's version right after this change (the first change is 1).
        op: ``"set"`` or ``"delete"``.
        pointer: Where: the pointer as written, except that an append (``.../-``) is recorded
            with the index the value got.
        old: The value before, or None if there was none.
        new: The value after (for a set), or None (for a delete).
    """

    version: int
    op: Literal["set", "delete"]
    pointer: str
    old: JsonValue | None = None
    new: JsonValue | None = None
