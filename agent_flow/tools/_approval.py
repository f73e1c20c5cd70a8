"""Asking for approval of a tool call the policy holds back (`requires_approval`).

The approver (an `ApprovalCallback`) answers with a bool or an `ApprovalResponse`. With no
approver, no answer within the approval timeout, or an approver that raises, the answer is
a refusal that says why: asking never fails the call's turn.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from agent_flow.tools._hooks import _hook
from agent_flow.tools.policy import ApprovalRequest, ApprovalResponse

if TYPE_CHECKING:
    from agent_flow._types import JsonObject
    from agent_flow.messages import ToolCall
    from agent_flow.tools._hooks import ToolHooks
    from agent_flow.tools._registry import RegisteredTool
    from agent_flow.tools.policy import ApprovalCallback, PolicyDecision

# Logged under the public module's name, which is where users configure the executor's logs.
logger = logging.getLogger("agent_flow.tools.executor")


async def _ask_approval(
    call: ToolCall,
    registered: RegisteredTool,
    arguments: JsonObject,
    decision: PolicyDecision,
    *,
    approver: ApprovalCallback | None,
    approval_timeout: float | None,
    hooks: ToolHooks,
) -> ApprovalResponse:
    """Ask `approver` whether the call may run, telling `hooks` before and after.

    Returns:
        The answer; a refusal with the reason when there is no approver, it does not answer
        within `approval_timeout` seconds, or it raises.
    """
    request = ApprovalRequest(
        call_id=call.id,
        tool_name=registered.name,
        arguments=arguments,
        reason=decision.reason,
        risk=registered.policy.risk,
    )
    await _hook(hooks.approval_required(call, request))
    if approver is None:
        response = ApprovalResponse(
            approved=False, reason="it needs approval and no approver is configured"
        )
    else:
        try:
            async with asyncio.timeout(approval_timeout):
                answer = await approver(request)
            response = (
                answer
                if isinstance(answer, ApprovalResponse)
                else ApprovalResponse(approved=bool(answer))
            )
        except TimeoutError:
            response = ApprovalResponse(
                approved=False, reason=f"no answer within {approval_timeout:g}s"
            )
        except Exception as err:  # an approver failure must not crash the loop
            logger.warning("the approval callback raised", exc_info=err)
            response = ApprovalResponse(
                approved=False, reason=f"asking for approval failed ({err})"
            )
    await _hook(hooks.approval_resolved(call, response))
    return response
