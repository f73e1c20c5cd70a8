"""Deferred tool calls: the calls a run hands to its caller, and the run that takes up the answers.

Two kinds of call leave a run without being executed (`DeferredCall.kind`):

- ``external``: a call of an `ExternalTool` (a front end's tool): the caller runs it;
- ``approval``: in a run started with ``defer_approvals=True``, a call the `PolicyEngine`
  holds for approval: the caller approves or denies it (instead of the run waiting for its
  approver).

`route_calls` decides, for each call of a model turn, in this order:

1. a call the executor must refuse anyway (unknown tool, unreadable or invalid arguments, a
   tool the policy denies) goes to the executor, which answers it with an error result;
2. a call the caller answered (`DeferredResults`): an external call gets the caller's result
   (redacted, cut to the output limit and given to the result handlers like any result); an
   approval answer runs the call through the executor with that answer;
3. an external call is handed over; when the policy wants its approval, the run's approver is
   asked first, unless approvals are deferred: then the caller that runs it is the one asked;
4. a call that needs approval, in a run that defers approvals, is handed over;
5. every other call is executed.

A turn that handed calls over ends the run with `StopReason.DEFERRED` once its other calls
have their results (a loop-control call of the same turn waits: the calls handed over come
first). The handed calls stay in the history without results. The next run
(`AgentExecutor.send` with `DeferredResults`) first answers them (`take_up_answers`), then adds
its user message, if any, and calls the model. A handed call the next run does not answer gets
an error result saying so, as any call a run left open: the history never sends a call
without its result.

Events: an external call handed over is a ``tool_call_started`` (its result, in the next run,
a ``tool_call_completed``); an approval handed over is an ``approval_required`` (the next run
asks again, and the recorded answer resolves it at once: ``approval_required``,
``approval_resolved``, then the call's own events).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from agent_flow._types import FrozenModel, JsonObject, JsonValue
from agent_flow.agent.outcome import DeferredCall, Finish, RunTools, StopReason
from agent_flow.errors import UserError
from agent_flow.history import UserMessage
from agent_flow.messages import ToolCall
from agent_flow.tools import (
    ApprovalCallback,
    ApprovalRequest,
    ApprovalResponse,
    ExternalTool,
    ToolOutcome,
    ToolResult,
)
from agent_flow.tools._approval import _ask_approval
from agent_flow.tools._hooks import _hook
from agent_flow.tools._validation import _schema_problems

if TYPE_CHECKING:
    from agent_flow.agent._loop import _Run
    from agent_flow.agent.executor import AgentExecutor
    from agent_flow.environment import EnvironmentChange
    from agent_flow.tools import HandlerError, PolicyDecision, RegisteredTool

__all__ = ["DeferredResults", "Routed", "check_answers", "route_calls", "take_up_answers"]


class DeferredResults(FrozenModel):
    """The caller's answers to the calls a run handed over (`ExecutionOutcome.deferred`).

    Pass them to `AgentExecutor.send` to continue the conversation from those calls.

    Attributes:
        calls: The result of each external call the caller ran, by call id: a `ToolResult`
            (``ToolResult.error(...)`` for a failure), or its text.
        approvals: The answer to each call handed over for approval, by call id: an
            `ApprovalResponse`, or a bool.
    """

    calls: dict[str, ToolResult] = Field(default_factory=dict)
    approvals: dict[str, ApprovalResponse] = Field(default_factory=dict)

    @field_validator("calls", mode="before")
    @classmethod
    def _texts(cls, value: JsonValue) -> JsonValue:
        if isinstance(value, Mapping):
            return {k: {"content": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("approvals", mode="before")
    @classmethod
    def _bools(cls, value: JsonValue) -> JsonValue:
        if isinstance(value, Mapping):
            return {k: {"approved": v} if isinstance(v, bool) else v for k, v in value.items()}
        return value

    @property
    def call_ids(self) -> frozenset[str]:
        """Every call id answered, either way."""
        return frozenset(self.calls) | frozenset(self.approvals)


def check_answers(
    agent: AgentExecutor, message: str | None, answers: DeferredResults | None
) -> None:
    """Refuse a `send` without a message or answers, or answers that do not fit the calls waiting.

    Raises:
        UserError: Neither a message nor answers; an answer names no call waiting for one, a
            call is answered twice, a result answers a call of a tool the agent runs itself
            (only its approval can be given), or an approval answers an external tool's call
            (give its result).
    """
    if answers is None or not answers.call_ids:
        if message is None:
            raise UserError("send needs a message, or results for the calls handed over")
        return
    pending = {entry.call_id: entry.call for entry in agent.history.pending_calls()}
    both = set(answers.calls) & set(answers.approvals)
    if both:
        raise UserError(
            f"calls {sorted(both)!r} have both a result and an approval; give each call one"
        )
    unknown = sorted(answers.call_ids - pending.keys())
    if unknown:
        waiting = ", ".join(sorted(pending)) or "none"
        raise UserError(
            f"no call {unknown[0]!r} waits for an answer; the calls waiting are: {waiting}"
        )
    for call_id in answers.calls:
        if not _is_external(agent, pending[call_id].name):
            raise UserError(
                f"call {call_id!r} is a call of {pending[call_id].name!r}, which the agent runs "
                "itself: approve or deny it (DeferredResults.approvals), never give its result"
            )
    for call_id in answers.approvals:
        if _is_external(agent, pending[call_id].name):
            raise UserError(
                f"call {call_id!r} is a call of the external tool {pending[call_id].name!r}: "
                "give its result (DeferredResults.calls)"
            )


def _is_external(agent: AgentExecutor, name: str) -> bool:
    registered = agent.tools.tools.get(name)
    return registered is not None and isinstance(registered.tool, ExternalTool)


@dataclass
class Routed:
    """Where each call of a turn goes (`route_calls`).

    Attributes:
        execute: The calls for the tool executor, in call order.
        handed: The calls handed to the caller, by call id, in call order.
        outcomes: Outcomes of calls answered without the executor (the caller's results,
            external calls whose approval was refused), by call id; their events are out.
        approval: The approver for `execute` (None: the agent's own).
    """

    execute: list[ToolCall] = field(default_factory=list)
    handed: dict[str, DeferredCall] = field(default_factory=dict)
    outcomes: dict[str, ToolOutcome] = field(default_factory=dict)
    approval: ApprovalCallback | None = None


async def route_calls(run: _Run, calls: list[ToolCall]) -> Routed:
    """Route one turn's calls (see the module doc); publishes the events of those handed over."""
    agent = run.agent
    answers = run.answers
    routed = Routed()
    if answers is None and not run.defer_approvals and not _has_external(agent):
        routed.execute = list(calls)  # the common case: nothing to hand over
        return routed
    registry = agent.tools.tools
    recorded: dict[str, ApprovalResponse] = {}
    for call in calls:
        registered = registry.get(call.name)
        arguments = call.parsed_arguments
        if registered is None or arguments is None or _schema_problems(registered, arguments):
            routed.execute.append(call)  # the executor tells the model what is wrong
            continue
        decision = agent.tools.policy.evaluate(registered.name, registered.policy, arguments)
        external = isinstance(registered.tool, ExternalTool)
        needs_approval = decision.verdict == "requires_approval"
        if decision.verdict == "denied":
            routed.execute.append(call)  # refused by the executor, with the policy's reason
        elif answers is not None and call.id in answers.calls:
            routed.outcomes[call.id] = await _answered(run, call, answers.calls[call.id])
        elif answers is not None and call.id in answers.approvals:
            answer = answers.approvals[call.id]
            if answer.approved:
                recorded[call.id] = answer
                routed.execute.append(call)
            else:  # never run, whatever the policy says now
                await _hook(agent._hooks.call_started(call))
                refused = await _ask(run, call, registered, arguments, decision, _fixed(answer))
                assert refused is not None  # a refusal answers with one
                routed.outcomes[call.id] = refused
        elif external:
            await _hook(agent._hooks.call_started(call))
            refusal = None
            if needs_approval and not run.defer_approvals:
                refusal = await _ask(run, call, registered, arguments, decision, _approver(run))
            if refusal is None:
                routed.handed[call.id] = _deferred(call, "external")
            else:
                routed.outcomes[call.id] = refusal
        elif needs_approval and run.defer_approvals:
            request = ApprovalRequest(
                call_id=call.id,
                tool_name=registered.name,
                arguments=arguments,
                reason=decision.reason,
                risk=registered.policy.risk,
            )
            await _hook(agent._hooks.approval_required(call, request))
            routed.handed[call.id] = _deferred(call, "approval", reason=decision.reason)
        else:
            routed.execute.append(call)
    if recorded:
        routed.approval = _recorded_approver(run, recorded)
    return routed


def _has_external(agent: AgentExecutor) -> bool:
    """Whether any external tool is registered (checked first: usually none is)."""
    return any(isinstance(r.tool, ExternalTool) for r in agent.tools.tools.values())


def _deferred(
    call: ToolCall, kind: Literal["external", "approval"], *, reason: str = ""
) -> DeferredCall:
    return DeferredCall(
        call_id=call.id, name=call.name, arguments=call.arguments, kind=kind, reason=reason
    )


async def _answered(run: _Run, call: ToolCall, given: ToolResult) -> ToolOutcome:
    """The outcome of an external call from the caller's result, as the executor would make it.

    The result is redacted of known secrets and cut to the output limit like any tool's, and
    the result handlers see it whole; its events are published here.
    """
    tools = run.agent.tools
    full = tools.secrets.redact_result(
        given.model_copy(update={"call_id": call.id, "tool_name": call.name})
    )
    if full.is_error and full.error_kind is None:
        full = full.model_copy(update={"error_kind": "reported"})
    shown = tools._truncate(full)  # the executor's own limit for this tool
    errors: tuple[HandlerError, ...] = ()
    changes: tuple[EnvironmentChange, ...] = ()
    if not full.is_error:
        report = tools.handlers.apply(run.agent.environment, call, full)
        errors, changes = tuple(report.errors), tuple(report.changes)
    await _hook(run.agent._hooks.call_finished(call, shown))
    return ToolOutcome(
        call=call,
        result=shown,
        full_result=full,
        handler_errors=errors,
        environment_changes=changes,
    )


async def _ask(
    run: _Run,
    call: ToolCall,
    registered: RegisteredTool,
    arguments: JsonObject,
    decision: PolicyDecision,
    approver: ApprovalCallback | None,
) -> ToolOutcome | None:
    """Ask `approver` about a call the executor will not run: None if approved, else its refusal.

    The events are the executor's (``approval_required``, ``approval_resolved``, then
    ``tool_call_failed`` for a refusal), and so is the refusal the model reads.
    """
    hooks = run.agent._hooks
    response = await _ask_approval(
        call,
        registered,
        arguments,
        decision,
        approver=approver,
        approval_timeout=run.agent.tools.approval_timeout,
        hooks=hooks,
    )
    if response.approved:
        return None
    because = f": {response.reason}" if response.reason else ""
    result = ToolResult.error(
        f"the user did not approve the call to {registered.name!r}{because}; "
        "do not repeat it unchanged",
        kind="not_approved",
    ).model_copy(update={"call_id": call.id, "tool_name": registered.name})
    await _hook(hooks.call_finished(call, result))
    return ToolOutcome(
        call=call, result=result, full_result=result, decision=decision, approval=response
    )


def _approver(run: _Run) -> ApprovalCallback | None:
    """The approver the executor would ask for this run's calls."""
    agent = run.agent
    return agent.approval if agent.approval is not None else agent.tools.approval


def _fixed(answer: ApprovalResponse) -> ApprovalCallback:
    async def approve(request: ApprovalRequest) -> ApprovalResponse:
        return answer

    return approve


def _recorded_approver(run: _Run, recorded: Mapping[str, ApprovalResponse]) -> ApprovalCallback:
    """An approver answering the calls of `recorded` with the caller's answers, others as usual."""
    fallback = _approver(run)

    async def approve(request: ApprovalRequest) -> ApprovalResponse | bool:
        answer = recorded.get(request.call_id)
        if answer is not None:
            return answer
        if fallback is None:
            return ApprovalResponse(
                approved=False, reason="it needs approval and no approver is configured"
            )
        return await fallback(request)

    return approve


async def take_up_answers(run: _Run, message: str | None) -> Finish | None:
    """Answer the calls the last run handed over, then add `message` (the run's first step).

    Returns:
        A `Finish` when answering ended the run (a loop-control call, a stuck model) and
        there is no new message to answer; None to go on with the loop.
    """
    from agent_flow.agent._steps import _count_ahead, _tool_step  # they import this module

    answers = run.answers
    step = None
    if answers is not None:
        calls = tuple(
            entry.call
            for entry in run.agent.history.pending_calls()
            if entry.call_id in answers.call_ids
        )
        if calls:
            step = await _tool_step(run, RunTools(calls))
    if message is not None:
        try:
            await _count_ahead(run.agent.history.counter, message)
        finally:  # cancelled meanwhile, the message is still the history's
            run.agent.history.add(UserMessage(content=message))
    if isinstance(step, Finish) and (message is None or step.reason is StopReason.DEFERRED):
        return step
    return None
