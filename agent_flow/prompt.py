"""What `ContextManager.build_prompt` returns: the prompt, and where its tokens went.

`Prompt` is the provider-ready result (neutral messages and tool schemas, with their counted
size); `PromptBreakdown` splits that size by section. Events (`ContextBuilt`) and the
terminal's budget bar carry the breakdown, so it lives apart from the budgeting itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from agent_flow.messages import ChatMessage, ToolDefinition

__all__ = ["Prompt", "PromptBreakdown"]


class PromptBreakdown(BaseModel):
    """Where the tokens of one prompt went.

    Attributes:
        budget: ``max_tokens`` of the ContextManager.
        reserve: Tokens set aside for the answer.
        system_template: The system message without the environment text.
        environment: The environment text inside the system message.
        tools: The tool schemas (in XML tool mode: the tools prompt in the system message).
        history: The history messages sent (in XML tool mode: as rewritten).
        priming: The reply priming every request pays.
        total: Everything sent: system template + environment + tools + history + priming,
            counted as the prompt format sends it.
        environment_degraded: Whether the environment had to shrink to fit its share.
        history_units_sent: History units included in the prompt.
        history_units_omitted: History units left out because they did not fit.
    """

    model_config = ConfigDict(frozen=True)

    budget: int
    reserve: int
    system_template: int
    environment: int
    tools: int
    history: int
    priming: int
    total: int
    environment_degraded: bool
    history_units_sent: int
    history_units_omitted: int


@dataclass(frozen=True, slots=True)
class Prompt:
    """A provider-ready prompt and its token accounting.

    Attributes:
        messages: The system message, then the history (neutral: the client renders them).
        tools: The tool schemas offered with it.
        total_tokens: Counted size of messages and tools together, as the prompt format
            sends them.
        breakdown: The per-section split.
    """

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolDefinition, ...]
    total_tokens: int
    breakdown: PromptBreakdown
