"""Tools: define them, execute the model's calls safely, and connect MCP servers.

Also here: result handlers, policy and approvals, and the built-in workspace and
loop-control tools.

The pieces, by module:

- `base`: the `Tool` protocol, `BaseTool`, `@tool` (typed functions → tools), `ToolContext`;
- `results`: `ToolResult`, `Attachment` and the loop-control signals;
- `executor`: `ToolExecutor` (registry, validation, policy, timeouts, truncation, handlers),
  `ToolOutcome` and `ToolHooks`;
- `policy`: `ToolPolicy`, `PolicyEngine`, approval requests and responses;
- `handlers`: `HandlerRegistry` and the built-in result handlers;
- `mcp`: MCP server configs, `MCPConnection`, `MCPServers`, `MCPTool`; `mcp_resources`:
  MCP resources and prompts for an agent (tools, handler, loading); `filters`: tool and
  MCP component filters;
- `workspace`: `Workspace`, `workspace_tools` and `ShellSettings` (the shell's environment
  and confinement);
- `SecretRedactor`: known secret values, redacted from every tool result by the executor;
- `ExternalTool`: a tool the agent offers but its caller runs (a front end's tool): a run
  ends with its call handed over (`agent_flow.agent.DeferredResults` answers it);
- `control`: ``task_completion``, ``ask_question``, ``converse`` and ``update_plan``.

The modules starting with ``_`` hold the parts behind `executor` (registry, argument
validation, truncation, hooks, approval), `base` (``_threads``: the threads sync tools run
on), `workspace` (the safe root, the file tools, the shell tool) and `mcp` (connection,
transports, tool adaptation); import from the modules above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from agent_flow.tools._external import ExternalTool
from agent_flow.tools._secrets import SecretRedactor, looks_secret
from agent_flow.tools.base import (
    BaseTool,
    FunctionTool,
    ProgressCallback,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolOutput,
    parse_docstring,
    to_tool_result,
    tool,
)
from agent_flow.tools.control import (
    CONTROL_TOOL_NAMES,
    PlanStepInput,
    ask_question,
    control_tools,
    converse,
    task_completion,
    update_plan,
    with_result_schema,
)
from agent_flow.tools.executor import (
    MAX_TOOL_NAME_LENGTH,
    MIN_OUTPUT_TOKENS,
    RegisteredTool,
    ToolExecutor,
    ToolHooks,
    ToolOutcome,
    provider_tool_name,
)
from agent_flow.tools.filters import MCPFilter
from agent_flow.tools.handlers import (
    TOOL_RESULTS_EXTENSION,
    HandlerError,
    HandlerRegistry,
    HandlerReport,
    ResultHandler,
    directory_tree_handler,
    parse_text_tree,
    record_latest_result,
    search_results_handler,
)
from agent_flow.tools.mcp_config import (
    MCP_SERVER_CONFIG_ADAPTER,
    MCPAgentSettings,
    MCPPromptRef,
    MCPResourceLoad,
    MCPServerConfig,
    MCPServerHTTP,
    MCPServerStdio,
)
from agent_flow.tools.policy import (
    DEFAULT_DANGEROUS_COMMANDS,
    DEFAULT_FORBIDDEN_COMMANDS,
    ApprovalCallback,
    ApprovalRequest,
    ApprovalResponse,
    PolicyDecision,
    PolicyEngine,
    PolicyRule,
    RiskLevel,
    ToolPolicy,
    Verdict,
)
from agent_flow.tools.results import (
    CONTROL_SIGNAL_ADAPTER,
    Attachment,
    ControlSignal,
    ConverseMessage,
    ErrorKind,
    OutputCheck,
    PlanUpdate,
    TaskCompletion,
    ToolResult,
    UserQuestion,
)
from agent_flow.tools.workspace import (
    DEFAULT_COMMAND_ENV,
    DEFAULT_EXCLUDES,
    DEFAULT_HIDDEN_PATHS,
    SandboxMode,
    ShellSettings,
    UnsafePathError,
    Workspace,
    shell_boundary,
    workspace_tools,
)

if _TYPE_CHECKING:
    from agent_flow.tools.mcp import MCPConnection, MCPServers, MCPTool, convert_call_result

# The MCP client pulls in the MCP SDK (about a second to import): load it on first use.
_LAZY_MCP = frozenset({"MCPConnection", "MCPServers", "MCPTool", "convert_call_result"})


def __getattr__(name: str) -> object:
    if name in _LAZY_MCP:
        from agent_flow.tools import mcp

        return getattr(mcp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONTROL_SIGNAL_ADAPTER",
    "CONTROL_TOOL_NAMES",
    "DEFAULT_COMMAND_ENV",
    "DEFAULT_DANGEROUS_COMMANDS",
    "DEFAULT_EXCLUDES",
    "DEFAULT_FORBIDDEN_COMMANDS",
    "DEFAULT_HIDDEN_PATHS",
    "MAX_TOOL_NAME_LENGTH",
    "MCP_SERVER_CONFIG_ADAPTER",
    "MIN_OUTPUT_TOKENS",
    "TOOL_RESULTS_EXTENSION",
    "ApprovalCallback",
    "ApprovalRequest",
    "ApprovalResponse",
    "Attachment",
    "BaseTool",
    "ControlSignal",
    "ConverseMessage",
    "ErrorKind",
    "ExternalTool",
    "FunctionTool",
    "HandlerError",
    "HandlerRegistry",
    "HandlerReport",
    "MCPAgentSettings",
    "MCPConnection",
    "MCPFilter",
    "MCPPromptRef",
    "MCPResourceLoad",
    "MCPServerConfig",
    "MCPServerHTTP",
    "MCPServerStdio",
    "MCPServers",
    "MCPTool",
    "OutputCheck",
    "PlanStepInput",
    "PlanUpdate",
    "PolicyDecision",
    "PolicyEngine",
    "PolicyRule",
    "ProgressCallback",
    "RegisteredTool",
    "ResultHandler",
    "RiskLevel",
    "SandboxMode",
    "SecretRedactor",
    "ShellSettings",
    "TaskCompletion",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolExecutor",
    "ToolHooks",
    "ToolOutcome",
    "ToolOutput",
    "ToolPolicy",
    "ToolResult",
    "UnsafePathError",
    "UserQuestion",
    "Verdict",
    "Workspace",
    "ask_question",
    "control_tools",
    "converse",
    "convert_call_result",
    "directory_tree_handler",
    "looks_secret",
    "parse_docstring",
    "parse_text_tree",
    "provider_tool_name",
    "record_latest_result",
    "search_results_handler",
    "shell_boundary",
    "task_completion",
    "to_tool_result",
    "tool",
    "update_plan",
    "with_result_schema",
    "workspace_tools",
]
