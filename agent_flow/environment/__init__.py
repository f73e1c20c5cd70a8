"""The Environment: the agent's typed, versioned working memory, and its rendering under a budget.

Everything is still in `environment`; the next commit splits it into modules.
"""

from __future__ import annotations

from agent_flow.environment.environment import (
    DEFAULT_MAX_CHANGES,
    DROP_ORDER,
    RENDER_ORDER,
    ArtifactInfo,
    Environment,
    EnvironmentBuilder,
    EnvironmentChange,
    FileInfo,
    KnowledgeBase,
    PlanStep,
    RenderReport,
    SectionName,
    SectionRender,
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
