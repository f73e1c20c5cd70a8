"""agent_flow: stateful, tool-using LLM agents whose every prompt fits a hard token budget.

Every prompt is assembled within one budget from a typed `Environment` (what the agent knows
now, updated by tool results) and a prunable `History` (what was said and done). The
`AgentExecutor` runs the loop and publishes typed events to any number of subscribers.

Tools live in `agent_flow.tools`, model clients in `agent_flow.llm`, test doubles in
`agent_flow.testing`, sessions in `agent_flow.sessions`.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

if _TYPE_CHECKING:
    from agent_flow.agent import (
        AgentExecutor,
        Continue,
        DeferredCall,
        DeferredResults,
        ExecutionOutcome,
        Finish,
        RunTools,
        StopReason,
        ToolUse,
    )
    from agent_flow.config import (
        AgentConfig,
        ContextConfig,
        PolicyConfig,
        Pricing,
        Skill,
        load_config,
    )
    from agent_flow.context import ContextManager
    from agent_flow.delegation import Delegate, DelegationResult
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
    from agent_flow.handoff import Handoff, LastUnits, SummaryView, WholeConversation
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
    from agent_flow.llm.openai_client import OpenAIClient
    from agent_flow.messages import ChatMessage, ToolCall, ToolDefinition
    from agent_flow.prompt import Prompt, PromptBreakdown
    from agent_flow.tokens import ApproxCounter, TiktokenCounter, TokenCounter

__version__ = "0.1.0"

# Each public name is imported from its module on first use (PEP 562), so that importing a
# part of agent_flow (the CLI's ``--help``, `agent_flow.errors`) or only a few names costs
# only what those need: the pydantic models of the whole package take most of a second to
# build, and the openai SDK as long again.
_LAZY = {
    "AgentConfig": "agent_flow.config",
    "AgentEvent": "agent_flow.events",
    "AgentExecutor": "agent_flow.agent",
    "AgentFlowError": "agent_flow.errors",
    "AgentMessage": "agent_flow.history",
    "AgentThinking": "agent_flow.history",
    "ApproxCounter": "agent_flow.tokens",
    "ArtifactInfo": "agent_flow.environment",
    "Chain": "agent_flow.history",
    "ChatMessage": "agent_flow.messages",
    "Completion": "agent_flow.llm",
    "ConfigError": "agent_flow.errors",
    "ContextBudgetError": "agent_flow.errors",
    "ContextConfig": "agent_flow.config",
    "ContextManager": "agent_flow.context",
    "Continue": "agent_flow.agent",
    "DeferredCall": "agent_flow.agent",
    "DeferredResults": "agent_flow.agent",
    "Delegate": "agent_flow.delegation",
    "Handoff": "agent_flow.handoff",
    "LastUnits": "agent_flow.handoff",
    "SummaryView": "agent_flow.handoff",
    "WholeConversation": "agent_flow.handoff",
    "DelegationResult": "agent_flow.delegation",
    "DropOldest": "agent_flow.history",
    "ElideToolResults": "agent_flow.history",
    "Environment": "agent_flow.environment",
    "EnvironmentChange": "agent_flow.environment",
    "EventBus": "agent_flow.events",
    "ExecutionOutcome": "agent_flow.agent",
    "ExtractiveSummarizer": "agent_flow.history",
    "FileInfo": "agent_flow.environment",
    "Finish": "agent_flow.agent",
    "History": "agent_flow.history",
    "HistoryEntry": "agent_flow.history",
    "KnowledgeBase": "agent_flow.environment",
    "LLMClient": "agent_flow.llm",
    "LLMConfig": "agent_flow.llm",
    "LLMOverrides": "agent_flow.llm",
    "LLMRequest": "agent_flow.llm",
    "ModelError": "agent_flow.errors",
    "OpenAIClient": "agent_flow.llm.openai_client",
    "PlanStep": "agent_flow.environment",
    "PolicyConfig": "agent_flow.config",
    "Pricing": "agent_flow.config",
    "Prompt": "agent_flow.prompt",
    "PromptBreakdown": "agent_flow.prompt",
    "PruneReport": "agent_flow.history",
    "PruningStrategy": "agent_flow.history",
    "RunTools": "agent_flow.agent",
    "Skill": "agent_flow.config",
    "SlidingWindow": "agent_flow.history",
    "StopReason": "agent_flow.agent",
    "Subscription": "agent_flow.events",
    "SummarizeOldest": "agent_flow.history",
    "Summarizer": "agent_flow.history",
    "Summary": "agent_flow.history",
    "SystemState": "agent_flow.environment",
    "TaskState": "agent_flow.environment",
    "TaskStatus": "agent_flow.environment",
    "TiktokenCounter": "agent_flow.tokens",
    "TokenCounter": "agent_flow.tokens",
    "ToolCall": "agent_flow.messages",
    "ToolCallEntry": "agent_flow.history",
    "ToolDefinition": "agent_flow.messages",
    "ToolError": "agent_flow.errors",
    "ToolResultEntry": "agent_flow.history",
    "ToolUse": "agent_flow.agent",
    "UserError": "agent_flow.errors",
    "UserMessage": "agent_flow.history",
    "WorkspaceState": "agent_flow.environment",
    "event_from_json": "agent_flow.events",
    "event_to_json": "agent_flow.events",
    "load_config": "agent_flow.config",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    "DeferredCall",
    "DeferredResults",
    "Delegate",
    "DelegationResult",
    "DropOldest",
    "ElideToolResults",
    "Environment",
    "EnvironmentChange",
    "EventBus",
    "ExecutionOutcome",
    "ExtractiveSummarizer",
    "FileInfo",
    "Finish",
    "Handoff",
    "History",
    "HistoryEntry",
    "KnowledgeBase",
    "LLMClient",
    "LLMConfig",
    "LLMOverrides",
    "LLMRequest",
    "LastUnits",
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
    "SummaryView",
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
    "WholeConversation",
    "WorkspaceState",
    "__version__",
    "event_from_json",
    "event_to_json",
    "load_config",
]
