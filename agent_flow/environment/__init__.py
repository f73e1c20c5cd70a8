"""The Environment: the agent's typed, versioned working memory, and its rendering under a budget.

The state is plain JSON: the typed sections ``system``, ``task``, ``knowledge`` and
``workspace``, plus free ``extensions``. It is read and written by RFC 6901 pointer; every
write is validated, recorded as an `EnvironmentChange`, and undone whole if it fails.

The pieces, by module:

- `sections`: the section models (`SystemState`, `TaskState`, `KnowledgeBase`,
  `WorkspaceState` and their parts), the section names and `RENDER_ORDER`, and
  `EnvironmentChange`;
- `environment`: `Environment` (reads, writes, the change log, ``to_json``/``from_json``)
  and `DEFAULT_MAX_CHANGES`; `builder`: `EnvironmentBuilder`;
- `render`: what a render reports (`RenderReport`, `SectionRender`), `DROP_ORDER`, and the
  search that fits a budget;
- private: `_pointer` (JSON values, pointers and the types at pointer locations: the
  untyped part, isolated), `_writes` (one write applied with its undo), `_schemas` (JSON
  schema checks), `_snapshots` (read-only typed views), `_trim` and `_renderer` (trimming
  a section under caps; caching blocks and reports per section version).
"""

from __future__ import annotations

from agent_flow.environment.builder import EnvironmentBuilder
from agent_flow.environment.environment import DEFAULT_MAX_CHANGES, Environment
from agent_flow.environment.render import DROP_ORDER, RenderReport, SectionRender
from agent_flow.environment.sections import (
    RENDER_ORDER,
    ArtifactInfo,
    EnvironmentChange,
    FileInfo,
    KnowledgeBase,
    PlanStep,
    SectionName,
    SystemState,
    TaskState,
    TaskStatus,
    TypedSectionName,
    WorkspaceState,
)

__all__ = [
    "DEFAULT_MAX_CHANGES",
    "DROP_ORDER",
    "RENDER_ORDER",
    "ArtifactInfo",
    "Environment",
    "EnvironmentBuilder",
    "EnvironmentChange",
    "FileInfo",
    "KnowledgeBase",
    "PlanStep",
    "RenderReport",
    "SectionName",
    "SectionRender",
    "SystemState",
    "TaskState",
    "TaskStatus",
    "TypedSectionName",
    "WorkspaceState",
]
