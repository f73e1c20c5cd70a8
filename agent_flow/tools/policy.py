"""Tool policy: which calls may run, which need the user's approval, which are refused.

Every tool carries a `ToolPolicy` (read-only, requires approval, risk level, and the name of
the argument holding a shell command, if any). A `PolicyEngine` turns a policy and the call's
arguments into a `PolicyDecision`, checking in this order:

1. tools denied by name (``fnmatch`` globs, `matches_any`) → denied;
2. read-only mode and a tool that is not read-only → denied;
3. a shell command matching a *forbidden* pattern (``rm -rf /``, ``mkfs``, a fork bomb) →
   denied, even with auto-approve;
4. custom rules, in order: the first one that returns a decision wins;
5. a shell command matching a *dangerous* pattern (``rm -r``, ``sudo``, ``curl … | sh``,
   ``git push --force``) → requires approval;
6. a tool whose policy requires approval, whose name is listed for approval, or whose risk
   reaches the approval threshold → requires approval;
7. otherwise → allowed.

With ``auto_approve=True`` (trusted runs) every "requires approval" becomes "allowed"; denials
stay denials. Approval itself is asked through an async `ApprovalCallback` the executor calls.

Denied tools are one concept across the library: the tool executor built from an
`AgentConfig` denies ``config.deny_tools`` here, and an agent never offers the model a tool
its executor's engine denies (nor one in its config's list), and refuses a call to one.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from enum import StrEnum
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

from agent_flow._types import JsonObject

__all__ = [
    "DEFAULT_DANGEROUS_COMMANDS",
    "DEFAULT_FORBIDDEN_COMMANDS",
    "ApprovalCallback",
    "ApprovalRequest",
    "ApprovalResponse",
    "PolicyDecision",
    "PolicyEngine",
    "PolicyRule",
    "RiskLevel",
    "ToolPolicy",
    "Verdict",
    "matches_any",
]


class RiskLevel(StrEnum):
    """How much harm a tool can do."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


_RISK_ORDER = {RiskLevel.LOW: 0, RiskLevel.MEDIUM: 1, RiskLevel.HIGH: 2}


class ToolPolicy(BaseModel):
    """What a tool may do and how carefully to treat it.

    Attributes:
        read_only: The tool only reads (allowed in read-only mode).
        requires_approval: Every call waits for the user's approval (unless auto-approved).
        risk: How much harm a call can do.
        command_argument: The argument holding a shell command, checked against the engine's
            forbidden and dangerous command patterns.
        idempotent: Running a call twice does no more than running it once. A durable run
            (`agent_flow.durable`) runs a call again that a crash interrupted only when its
            tool is idempotent (or `read_only`); otherwise the call gets an error result.
    """

    model_config = ConfigDict(frozen=True)

    read_only: bool = False
    requires_approval: bool = False
    risk: RiskLevel = RiskLevel.LOW
    command_argument: str | None = None
    idempotent: bool = False


Verdict: TypeAlias = Literal["allowed", "requires_approval", "denied"]


class PolicyDecision(BaseModel):
    """What the engine decided for one call, and why."""

    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    reason: str = ""


class ApprovalRequest(BaseModel):
    """A call waiting for the user's approval."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    tool_name: str
    arguments: JsonObject
    reason: str
    risk: RiskLevel


class ApprovalResponse(BaseModel):
    """The user's answer to an `ApprovalRequest`."""

    model_config = ConfigDict(frozen=True)

    approved: bool
    reason: str = ""
    #: Who answered, when known (the server's user name); kept in ``approval_resolved``.
    decided_by: str = ""


#: Answers approval requests: return ``True``/``False`` or an `ApprovalResponse` with a reason.
ApprovalCallback: TypeAlias = Callable[[ApprovalRequest], Awaitable["ApprovalResponse | bool"]]

#: A custom rule: return a decision to settle the call, or ``None`` to let later checks decide.
PolicyRule: TypeAlias = Callable[[str, ToolPolicy, JsonObject], PolicyDecision | None]

# Where a command word can start: the beginning, after a separator or a quote, or after a
# prefix command (so "grep -rn rm src/" does not look like "rm"). Quotes count as separators
# so "sh -c 'rm -r x'" is caught; a quoted argument that merely mentions a command then errs
# on the side of asking.
_AT = r"(?:^|[;&|()`\n\"'{]\s*|\b(?:sudo|doas|xargs|exec|nohup|env|time|command)\s+(?:-\S+\s+)*)"
_RM_FLAGS = r"rm\s+(?:-{1,2}[a-zA-Z-]*\s+)*"
_ROOT_TARGET = r"(?:/\*?|~/?\*?|\$HOME/?\*?|\$\{HOME\}/?\*?|\.\./?\*?)(?=\s|;|&|\||$)"

#: Commands refused outright, even with auto-approve (regular expressions, case-sensitive).
DEFAULT_FORBIDDEN_COMMANDS: tuple[str, ...] = (
    # rm of the root, the home directory or the workspace's parent, with any flags.
    _AT + _RM_FLAGS + _ROOT_TARGET,
    _AT + r"mkfs(?:\.\w+)?\b",
    _AT + r"dd\b[^;&|]*\bof=/dev/(?:sd|nvme|hd|xvd|vd|mmcblk)",
    r">\s*/dev/(?:sd|nvme|hd|xvd|vd|mmcblk)",
    r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:",  # the classic fork bomb
    _AT + r"chmod\s+(?:-\S+\s+)*[0-7]{3,4}\s+/(?=\s|$)",
    _AT + r"(?:shutdown|reboot|halt|poweroff)\b",
)

#: Commands that need approval even when the tool would not (regular expressions).
DEFAULT_DANGEROUS_COMMANDS: tuple[str, ...] = (
    _AT + r"rm(?:\s|$)",
    _AT + r"(?:sudo|doas)\b",
    _AT + r"su\b",
    r"\b(?:curl|wget)\b[^|]*\|\s*(?:sudo\s+)?(?:ba|z|da)?sh\b",
    _AT + r"git\s+push\b[^;&|]*\s(?:--force\S*|-f)\b",
    _AT + r"git\s+(?:reset\s+--hard|clean\s+-[a-zA-Z]*f)",
    _AT + r"(?:chmod|chown|chgrp)\b",
    _AT + r"(?:kill|killall|pkill)\b",
    _AT + r"dd\b",
    _AT + r"find\b[^;&|]*\s-delete\b",
    r">\s*/(?:etc|usr|bin|sbin|boot|lib)/",
)


def _compile(patterns: Iterable[str | re.Pattern[str]]) -> tuple[re.Pattern[str], ...]:
    return tuple(p if isinstance(p, re.Pattern) else re.compile(p) for p in patterns)


def _normalize_command(command: str) -> str:
    # Collapse whitespace so "rm  -rf\t/" matches like "rm -rf /".
    return " ".join(command.split())


class PolicyEngine:
    """Decides, per call, whether a tool may run, needs approval, or is refused.

    Args:
        auto_approve: Turn every "requires approval" into "allowed" (trusted runs).
        read_only: Refuse every tool whose policy is not read-only.
        denied_tools: Tool names (``fnmatch`` globs on the registered name) that are always
            refused, whatever the other settings say. An agent using this engine's executor
            also never offers them to its model.
        approval_tools: Tool names (globs) that always need approval.
        approval_risk: Tools at or above this risk need approval (``None``: risk alone never
            asks).
        forbidden_commands: Shell command patterns that are always refused.
        dangerous_commands: Shell command patterns that need approval.
        rules: Custom rules, consulted after the forbidden-command check.
    """

    def __init__(
        self,
        *,
        auto_approve: bool = False,
        read_only: bool = False,
        denied_tools: Iterable[str] = (),
        approval_tools: Iterable[str] = (),
        approval_risk: RiskLevel | None = RiskLevel.HIGH,
        forbidden_commands: Iterable[str | re.Pattern[str]] = DEFAULT_FORBIDDEN_COMMANDS,
        dangerous_commands: Iterable[str | re.Pattern[str]] = DEFAULT_DANGEROUS_COMMANDS,
        rules: Sequence[PolicyRule] = (),
    ) -> None:
        self.auto_approve = auto_approve
        self.read_only = read_only
        self.denied_tools = tuple(denied_tools)
        self.approval_tools = tuple(approval_tools)
        self.approval_risk = approval_risk
        self.forbidden_commands = _compile(forbidden_commands)
        self.dangerous_commands = _compile(dangerous_commands)
        self.rules = tuple(rules)

    def evaluate(self, tool_name: str, policy: ToolPolicy, arguments: JsonObject) -> PolicyDecision:
        """Decide what happens to one call of `tool_name` with `arguments`."""
        decision = self._evaluate(tool_name, policy, arguments)
        if decision.verdict == "requires_approval" and self.auto_approve:
            return PolicyDecision(verdict="allowed", reason=f"auto-approved: {decision.reason}")
        return decision

    def _evaluate(
        self, tool_name: str, policy: ToolPolicy, arguments: JsonObject
    ) -> PolicyDecision:
        if matches_any(tool_name, self.denied_tools):
            return PolicyDecision(
                verdict="denied", reason=f"tool {tool_name!r} is denied by policy"
            )
        if self.read_only and not policy.read_only:
            return PolicyDecision(
                verdict="denied",
                reason=f"tool {tool_name!r} can modify things and this run is read-only",
            )
        command = self._command(policy, arguments)
        if command is not None:
            for pattern in self.forbidden_commands:
                if pattern.search(command):
                    return PolicyDecision(
                        verdict="denied",
                        reason=f"command {command!r} matches the forbidden pattern "
                        f"{pattern.pattern!r}",
                    )
        for rule in self.rules:
            decision = rule(tool_name, policy, arguments)
            if decision is not None:
                return decision
        if command is not None:
            for pattern in self.dangerous_commands:
                if pattern.search(command):
                    return PolicyDecision(
                        verdict="requires_approval",
                        reason=f"command {command!r} matches the dangerous pattern "
                        f"{pattern.pattern!r}",
                    )
        if policy.requires_approval:
            return PolicyDecision(
                verdict="requires_approval", reason=f"tool {tool_name!r} requires approval"
            )
        if matches_any(tool_name, self.approval_tools):
            return PolicyDecision(
                verdict="requires_approval",
                reason=f"tool {tool_name!r} is listed as needing approval",
            )
        if self.approval_risk is not None and (
            _RISK_ORDER[policy.risk] >= _RISK_ORDER[self.approval_risk]
        ):
            return PolicyDecision(
                verdict="requires_approval",
                reason=f"tool {tool_name!r} has {policy.risk.value} risk",
            )
        return PolicyDecision(verdict="allowed")

    @staticmethod
    def _command(policy: ToolPolicy, arguments: JsonObject) -> str | None:
        if policy.command_argument is None:
            return None
        value = arguments.get(policy.command_argument)
        return _normalize_command(value) if isinstance(value, str) else None


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """Whether `name` matches one of the ``fnmatch`` globs in `patterns` (case-sensitive).

    The one glob rule of every tool list: denied and approval tools, an agent's allow and
    deny lists, a skill's tools, an MCP server's allow and deny lists.
    """
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
