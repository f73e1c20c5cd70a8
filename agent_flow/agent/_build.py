"""Factories that turn an `AgentConfig` into the parts an executor runs with.

The token counter, the pruning strategy, the tool executor and the streaming default.
"""

from __future__ import annotations

import warnings

from agent_flow.config import AgentConfig
from agent_flow.errors import ConfigError
from agent_flow.history import (
    Chain,
    DropOldest,
    ElideToolResults,
    PruningStrategy,
    SlidingWindow,
    SummarizeOldest,
)
from agent_flow.llm.base import LLMClient
from agent_flow.tokens import (
    ApproxCounter,
    TiktokenCounter,
    TokenCounter,
    TokenizerFallbackWarning,
)
from agent_flow.tools import (
    ApprovalCallback,
    PolicyEngine,
    SecretRedactor,
    ToolExecutor,
    Workspace,
    workspace_tools,
)

__all__ = ["counter_for", "tool_executor_from_config"]


def counter_for(config: AgentConfig) -> TokenCounter:
    """The token counter an agent of `config` counts with (its model's tokenizer encoding).

    What a process that reads or prepares that agent's sessions should count with, so that it
    loads no other encoding and its counts are the agent's.
    """
    return _make_counter(config)[0]


def _make_counter(config: AgentConfig) -> tuple[TokenCounter, str | None]:
    """Return the counter for the configured model, and a note if it had to fall back."""
    if config.context.counter == "approx":
        return ApproxCounter(), None
    try:
        model = config.resolved_llm().model if config.llm is not None else None
    except ConfigError:
        model = None
    if model is None:
        return TiktokenCounter(), None
    # A model whose encoding is not installed is counted with cl100k_base; the executor
    # reports that as a warning event of each run instead of through the warnings module.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TokenizerFallbackWarning)
        counter = TiktokenCounter(model)
    notes = [str(w.message) for w in caught if issubclass(w.category, TokenizerFallbackWarning)]
    return counter, (notes[0] if notes else None)


def _strategy(
    config: AgentConfig, llm: LLMClient, counter: TokenCounter
) -> PruningStrategy | SummarizeOldest:
    """Return the pruning strategy ``config.context.strategy`` names."""
    settings = config.context
    match settings.strategy:
        case "elide_then_drop":
            return Chain(ElideToolResults(), DropOldest())
        case "drop_oldest":
            return DropOldest()
        case "sliding_window":
            return Chain(SlidingWindow(settings.window_turns), DropOldest())
        case "summarize":
            from agent_flow.llm.summarizer import LLMSummarizer

            return SummarizeOldest(
                LLMSummarizer(llm, counter=counter),
                before=ElideToolResults(),
                after=DropOldest(),
            )


def tool_executor_from_config(
    config: AgentConfig, *, approval: ApprovalCallback | None = None
) -> ToolExecutor:
    """Build the tool executor `config` describes.

    It gets the configured policy (whose denied tools are ``config.deny_tools``), timeouts
    and output limit, a `SecretRedactor` that knows the model's key and
    ``config.secret_env`` besides every secret-looking variable, and the built-in file tools
    (with ``config.shell``) when ``config.workspace`` names a directory. MCP servers need a
    running connection: the agent starts them (see `AgentExecutor`).

    Raises:
        ToolError: The workspace directory cannot be used.
        UserError: ``config.shell`` asks for a confinement this machine cannot give.
    """
    secrets = SecretRedactor.from_environment(names=config.secret_env)
    try:
        if config.llm is not None:
            secrets.add_env(config.resolved_llm().resolved_api_key_env())
    except ConfigError:
        pass  # no model configured yet: the secret-looking variables are still covered
    policy = config.policy
    executor = ToolExecutor(
        policy=PolicyEngine(
            auto_approve=policy.auto_approve,
            read_only=policy.read_only,
            denied_tools=config.deny_tools,
            approval_tools=policy.approval_tools,
            approval_risk=policy.approval_risk,
        ),
        approval=approval,
        default_timeout=config.tool_timeout,
        max_output_tokens=config.max_tool_output_tokens,
        secrets=secrets,
    )
    if config.workspace is not None:
        executor.register_all(workspace_tools(Workspace(config.workspace), shell=config.shell))
    return executor


def _config_streams(config: AgentConfig) -> bool:
    try:
        return config.resolved_llm().stream if config.llm is not None else True
    except ConfigError:
        return True
