"""agent_flow: stateful, tool-using LLM agents whose every prompt fits a hard token budget.

Every prompt is assembled within one budget from a typed `Environment` (what the agent knows
now, updated by tool results) and a prunable `History` (what was said and done). The
`AgentExecutor` runs the loop and publishes typed events to any number of subscribers.

Tools live in `agent_flow.tools`, model clients in `agent_flow.llm`, test doubles in
`agent_flow.testing`, sessions in `agent_flow.sessions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from agent_flow.agent import (
    AgentExecutor,
    Continue,
    ExecutionOutcome,
    Finish,
    RunTools,
    StopReason,
    ToolUse,
)
from agent_flow.config import AgentConfig, ContextConfig, PolicyConfig, Pricing, Skill, load_config
from agent_flow.context import ContextManager
from agent_flow.environment import (
    ArtifactInfo,
    Environment,
    EnvironmentChange,
    FileInfo,
    KnowledgeBase,
    PlanStep,
    SystemState,
    TaskState,
    TaskStatus,
    WorkspaceState,
)
from agent_flow.errors import (
    AgentFlowError,
    ConfigError,
    ContextBudgetError,
    ModelError,
    ToolError,
    UserError,
)
from agent_flow.events import AgentEvent, EventBus, Subscription, event_from_json, event_to_json
from agent_flow.history import (
    AgentMessage,
    AgentThinking,
    Chain,
    DropOldest,
    ElideToolResults,
    ExtractiveSummarizer,
    History,
    HistoryEntry,
    PruneReport,
    PruningStrategy,
    SlidingWindow,
    SummarizeOldest,
    Summarizer,
    Summary,
    ToolCallEntry,
    ToolResultEntry,
    UserMessage,
)
from agent_flow.llm import Completion, LLMClient, LLMConfig, LLMOverrides, LLMRequest
from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
from agent_flow.prompt import Prompt, PromptBreakdown
from agent_flow.tokens import ApproxCounter, TiktokenCounter, TokenCounter

if _TYPE_CHECKING:
    from agent_flow.llm.openai_client import OpenAIClient

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The openai SDK takes most of a second to import: load it when the client is used.
    if name == "OpenAIClient":
        from agent_flow.llm.openai_client import OpenAIClient

        return OpenAIClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AgentConfig",
    "AgentEvent",
    "AgentExecutor",
    "AgentFlowError",
    "AgentMessage",
    "AgentThinking",
    "ApproxCounter",
    "ArtifactInfo",
    "Chain",
    "ChatMessage",
    "Completion",
    "ConfigError",
    "ContextBudgetError",
    "ContextConfig",
    "ContextManager",
    "Continue",
    "DropOldest",
    "ElideToolResults",
    "Environment",
    "EnvironmentChange",
    "EventBus",
    "ExecutionOutcome",
    "ExtractiveSummarizer",
    "FileInfo",
    "Finish",
    "History",
    "HistoryEntry",
    "KnowledgeBase",
    "LLMClient",
    "LLMConfig",
    "LLMOverrides",
    "LLMRequest",
    "ModelError",
    "OpenAIClient",
    "PlanStep",
    "PolicyConfig",
    "Pricing",
    "Prompt",
    "PromptBreakdown",
    "PruneReport",
    "PruningStrategy",
    "RunTools",
    "Skill",
    "SlidingWindow",
    "StopReason",
    "Subscription",
    "SummarizeOldest",
    "Summarizer",
    "Summary",
    "SystemState",
    "TaskState",
    "TaskStatus",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "ToolCallEntry",
    "ToolDefinition",
    "ToolError",
    "ToolResultEntry",
    "ToolUse",
    "UserError",
    "UserMessage",
    "WorkspaceState",
    "__version__",
    "event_from_json",
    "event_to_json",
    "load_config",
]
