"""The LLM layer: the `LLMClient` protocol, the OpenAI-compatible client, XML tool mode.

```
LLMRequest ──▶ LLMClient.complete() ──▶ Completion
           └─▶ LLMClient.stream()   ──▶ TextChunk | ThinkingChunk | ToolCallChunk
                                        | ToolCallArgumentsChunk | StreamWarning ... Completion
```

`OpenAIClient` speaks to any OpenAI-compatible server; `agent_flow.testing` holds the
scripted doubles; `LLMSummarizer` lets pruning summarize history with a model. Around the
calls: `agent_flow.llm.metering` counts and admits the calls made on an agent's behalf
outside its own step, and `agent_flow.llm.observers` lets a watcher (the telemetry ring) see
an agent's calls as they happen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from agent_flow.llm.base import (
    STREAM_EVENT_ADAPTER,
    Completion,
    FinishReason,
    LLMClient,
    LLMRequest,
    RetryNotice,
    StreamEvent,
    StreamWarning,
    TextChunk,
    ThinkingChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    ToolMode,
    Usage,
    completion_events,
    final_completion,
    normalize_finish_reason,
)
from agent_flow.llm.config import (
    PROVIDER_DEFAULTS,
    LLMConfig,
    LLMOverrides,
    Provider,
    resolve_llm_config,
)
from agent_flow.llm.summarizer import LLMSummarizer

if _TYPE_CHECKING:
    from agent_flow.llm.openai_client import OpenAIClient


def __getattr__(name: str) -> object:
    # The openai SDK takes most of a second to import: load it when the client is used.
    if name == "OpenAIClient":
        from agent_flow.llm.openai_client import OpenAIClient

        return OpenAIClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PROVIDER_DEFAULTS",
    "STREAM_EVENT_ADAPTER",
    "Completion",
    "FinishReason",
    "LLMClient",
    "LLMConfig",
    "LLMOverrides",
    "LLMRequest",
    "LLMSummarizer",
    "OpenAIClient",
    "Provider",
    "RetryNotice",
    "StreamEvent",
    "StreamWarning",
    "TextChunk",
    "ThinkingChunk",
    "ToolCallArgumentsChunk",
    "ToolCallChunk",
    "ToolMode",
    "Usage",
    "completion_events",
    "final_completion",
    "normalize_finish_reason",
    "resolve_llm_config",
]
