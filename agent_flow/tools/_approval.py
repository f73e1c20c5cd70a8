"""Asking for approval of a tool call the policy holds back (`requires_approval`).

The approver (an `ApprovalCallback`) answers with a bool or an `ApprovalResponse`. With no
approver, no answer within the approval timeout, or an approver that raises, the answer is
a refusal that says why: asking never fails the call's turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

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

_T = TypeVar("_T")


async def _within(asking: Awaitable[_T], seconds: float | None) -> _T:
    """`asking`'s answer, or TimeoutError after `seconds` (None: no limit).

    An answer that has reached the approver when the deadline falls due (set before it, or
    by a callback of that turn of the loop) is kept: the approver may have told its user the
    answer was taken, where `asyncio.timeout` would cancel the task the answer just woke and
    the run would see a refusal the approver never gave. One given later finds the asking
    cancelled.

    Raises:
        TimeoutError: No answer in time.
        RuntimeError: The approver was cancelled (not by the deadline): no answer.
    """
    if seconds is None:
        return await asking
    task = asyncio.ensure_future(asking)
    expired = False
    try:
        await asyncio.wait((task,), timeout=seconds)
        if not task.done():
            # An answer given after the deadline fell due but before this resumed woke the
            # task, which runs before this does again: let it finish, not cut it off.
            await asyncio.sleep(0)
    finally:
        if not task.done():  # its deadline passed, or the run itself is cancelled
            expired = True
            task.cancel()
            await asyncio.wait((task,))  # let it clean up, as an inline cancel would
    if task.cancelled():
        if expired:
            raise TimeoutError
        raise RuntimeError("the approver was cancelled")
    return task.result()


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
            answer = await _within(approver(request), approval_timeout)
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
