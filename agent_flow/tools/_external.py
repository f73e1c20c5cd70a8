"""`ExternalTool`: a tool the agent offers its model but its caller runs (a front end's tool).

The model sees it as any other tool (name, description, parameter schema) and its calls go
through the same checks: the agent's allow and deny lists, the active skill, argument
validation, the `PolicyEngine`. A call that passes is not executed: the agent loop ends the run
with the call handed to its caller (`StopReason.DEFERRED`, `agent_flow.agent._deferred`), and
the run that the caller starts with the call's result (`DeferredResults`) goes on from there.
This is how an AG-UI front end offers actions and human-in-the-loop steps
(`agent_flow.server._agui`).
"""

from __future__ import annotations

from agent_flow._types import JsonObject
from agent_flow.tools.base import ToolContext, ToolOutput
from agent_flow.tools.policy import ToolPolicy
from agent_flow.tools.results import ToolResult

__all__ = ["ExternalTool"]

_NO_PARAMETERS: JsonObject = {"type": "object", "properties": {}}


class ExternalTool:
    """A tool whose calls the agent's caller runs: the run ends with the call handed over.

    Args:
        name: The name the model calls it by.
        description: What it does, for the model.
        parameters: The JSON schema of its arguments (an object schema; none: no arguments).
        policy: How carefully to treat its calls (default: a low-risk tool that may change
            things, so a read-only policy engine refuses it).
    """

    def __init__(
        self,
        name: str,
        description: str = "",
        parameters: JsonObject | None = None,
        *,
        policy: ToolPolicy | None = None,
    ) -> None:
        self._name = name
        self._description = description
        self._parameters = parameters if parameters is not None else dict(_NO_PARAMETERS)
        self._policy = policy if policy is not None else ToolPolicy()

    @property
    def name(self) -> str:
        """The tool's name."""
        return self._name

    @property
    def description(self) -> str:
        """What it does, for the model."""
        return self._description

    @property
    def parameters(self) -> JsonObject:
        """The JSON schema of its arguments."""
        return self._parameters

    @property
    def policy(self) -> ToolPolicy:
        """Its policy."""
        return self._policy

    @property
    def timeout(self) -> float | None:
        """None: it never runs here, so it never times out here."""
        return None

    async def run(self, arguments: JsonObject, context: ToolContext) -> ToolOutput:
        """Answer a call made outside an agent run: this tool runs in the agent's caller."""
        return ToolResult.error(
            f"tool {self._name!r} is run by the agent's caller, not here; call it from an "
            "agent run, which hands the call over",
            kind="tool_error",
        )

    def __repr__(self) -> str:
        return f"ExternalTool({self._name!r})"
