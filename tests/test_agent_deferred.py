"""Deferred calls (agent/_deferred.py): an external tool's call, or an approval the run defers,
ends the run with the call handed to the caller; `send(results=...)` answers it and goes on.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_flow import AgentConfig, AgentExecutor, DeferredCall, DeferredResults, StopReason
from agent_flow.config import ContextConfig
from agent_flow.errors import UserError
from agent_flow.history import ToolCallEntry, ToolResultEntry
from agent_flow.sessions import InMemorySessionStore
from agent_flow.testing import ScriptedLLM, assert_units_intact, call, reply
from agent_flow.tools import (
    ApprovalRequest,
    ApprovalResponse,
    ExternalTool,
    PolicyEngine,
    ToolExecutor,
    ToolPolicy,
    ToolResult,
    tool,
)

CONFIG = AgentConfig(context=ContextConfig(max_tokens=16000, counter="approx"))
PICK = ExternalTool(
    "pick_color",
    "Ask the user to pick a color.",
    {"type": "object", "properties": {"hint": {"type": "string"}}, "required": ["hint"]},
)


def _tools(ran: list[str], *, policy: PolicyEngine | None = None) -> ToolExecutor:
    @tool(policy=ToolPolicy(requires_approval=True))
    def delete(path: str) -> str:
        """Delete a file.

        Args:
            path: Which.
        """
        ran.append(path)
        return f"deleted {path}"

    @tool
    def echo(text: str) -> str:
        """Say it back.

        Args:
            text: What.
        """
        return text

    executor = ToolExecutor([delete, echo], policy=policy)
    executor.register(PICK)
    return executor


def _kinds(agent: AgentExecutor) -> list[str]:
    return [type(entry).__name__ for entry in agent.history.entries]


async def test_an_external_call_ends_the_run_and_its_result_resumes_it() -> None:
    llm = ScriptedLLM(
        [
            reply("let me ask", tool_calls=[call("pick_color", hint="warm", call_id="c1")]),
            reply("you chose red"),
        ]
    )
    ran: list[str] = []
    store = InMemorySessionStore()
    agent = AgentExecutor(llm, config=CONFIG, tools=_tools(ran), store=store)
    events = agent.subscribe()
    first = await agent.run("paint it")
    assert first.stop_reason is StopReason.DEFERRED
    assert [(d.call_id, d.name, d.kind) for d in first.deferred] == [
        ("c1", "pick_color", "external")
    ]
    assert json.loads(first.deferred[0].arguments) == {"hint": "warm"}
    kinds = [event.kind async for event in events]
    assert "tool_call_started" in kinds and "tool_call_completed" not in kinds
    assert [call.call_id for call in agent.history.pending_calls()] == ["c1"]
    assert agent.session_id is not None
    assert (await store.info(agent.session_id)).status == "waiting"
    assert agent.environment.task.status.value == "waiting"

    events = agent.subscribe()
    second = await agent.send(results=DeferredResults(calls={"c1": "red"}))
    assert second.stop_reason is StopReason.ANSWERED and second.final_text == "you chose red"
    completed = [event async for event in events if event.kind == "tool_call_completed"]
    assert [(e.call_id, e.content) for e in completed] == [("c1", "red")]
    # The model's next prompt has the call answered by the caller's result.
    sent = llm.requests[1].messages
    assert_units_intact(sent)
    assert [m.content for m in sent if m.role == "tool"] == ["red"]
    assert second.tool_uses[0].content == "red"
    assert ran == []


async def test_deferred_approvals_run_the_approved_call_and_refuse_the_denied_one() -> None:
    llm = ScriptedLLM(
        [
            reply(tool_calls=[call("delete", path="a", call_id="d1")]),
            reply(tool_calls=[call("delete", path="b", call_id="d2")]),
            reply("done"),
        ]
    )
    ran: list[str] = []
    agent = AgentExecutor(llm, config=CONFIG, tools=_tools(ran))
    first = await agent.run("clean up", defer_approvals=True)
    assert first.stop_reason is StopReason.DEFERRED
    assert [(d.call_id, d.kind) for d in first.deferred] == [("d1", "approval")]
    assert "requires approval" in first.deferred[0].reason
    assert ran == []
    second = await agent.send(
        results=DeferredResults(approvals={"d1": ApprovalResponse(approved=True, decided_by="a")}),
        defer_approvals=True,
    )
    assert ran == ["a"] and second.stop_reason is StopReason.DEFERRED
    events = agent.subscribe()
    third = await agent.send(
        "never mind", results=DeferredResults(approvals={"d2": False}), defer_approvals=True
    )
    assert ran == ["a"], "a denied call never runs"
    assert third.stop_reason is StopReason.ANSWERED
    refused = third.tool_uses[0]
    assert refused.error_kind == "not_approved" and refused.is_error
    kinds = [event.kind async for event in events]
    assert kinds.index("approval_resolved") < kinds.index("tool_call_failed")
    # The denial's result comes before the new message, which comes before the answer.
    assert _kinds(agent)[-4:] == ["ToolCallEntry", "ToolResultEntry", "UserMessage", "AgentMessage"]
    assert_units_intact(agent.history)


async def test_answers_that_do_not_fit_the_calls_waiting_are_refused_when_send_is_called() -> None:
    llm = ScriptedLLM(
        [
            reply(
                tool_calls=[
                    call("pick_color", hint="x", call_id="c1"),
                    call("delete", path="a", call_id="d1"),
                ]
            ),
        ]
    )
    agent = AgentExecutor(llm, config=CONFIG, tools=_tools([]))
    outcome = await agent.run("go", defer_approvals=True)
    assert {d.call_id for d in outcome.deferred} == {"c1", "d1"}
    with pytest.raises(UserError, match="no call 'zz' waits"):
        agent.send(results=DeferredResults(calls={"zz": "x"}))
    with pytest.raises(UserError, match="approve or deny it"):
        agent.send(results=DeferredResults(calls={"d1": "forged result"}))
    with pytest.raises(UserError, match="give its result"):
        agent.send(results=DeferredResults(approvals={"c1": True}))
    with pytest.raises(UserError, match="both a result and an approval"):
        agent.send(results=DeferredResults(calls={"c1": "x"}, approvals={"c1": True}))
    with pytest.raises(UserError, match="needs a message"):
        agent.send()
    with pytest.raises(UserError, match="needs a message"):
        agent.send(results=DeferredResults())
    assert agent.run_id is None, "a refused send claims no run"


async def test_a_call_left_unanswered_gets_an_error_result_and_the_run_goes_on() -> None:
    llm = ScriptedLLM(
        [reply(tool_calls=[call("pick_color", hint="x", call_id="c1")]), reply("ok then")]
    )
    agent = AgentExecutor(llm, config=CONFIG, tools=_tools([]))
    await agent.run("go")
    outcome = await agent.send("forget it")
    assert outcome.stop_reason is StopReason.ANSWERED
    result = next(e for e in agent.history.entries if isinstance(e, ToolResultEntry))
    assert result.call_id == "c1" and result.is_error
    assert_units_intact(llm.requests[-1].messages)


async def test_external_tools_are_under_the_same_policy_as_the_agents_own() -> None:
    # Denied by name: the model gets the refusal and nothing is handed over.
    llm = ScriptedLLM([reply(tool_calls=[call("pick_color", hint="x", call_id="c1")]), "ok"])
    denied = AgentExecutor(
        llm, config=CONFIG, tools=_tools([], policy=PolicyEngine(denied_tools=("pick_*",)))
    )
    assert "pick_color" not in {d.name for d in denied.offered_tools()}
    outcome = await denied.run("go")
    assert outcome.stop_reason is StopReason.ANSWERED
    assert outcome.tool_uses[0].error_kind == "denied"
    # Invalid arguments: the executor's message, not a call handed over.
    llm = ScriptedLLM([reply(tool_calls=[call("pick_color", call_id="c1")]), "ok"])
    outcome = await AgentExecutor(llm, config=CONFIG, tools=_tools([])).run("go")
    assert outcome.tool_uses[0].error_kind == "invalid_arguments"
    # Approval needed, not deferred: the run's approver is asked before it is handed over.
    asked: list[str] = []

    async def approver(request: ApprovalRequest) -> bool:
        asked.append(request.call_id)
        return request.call_id == "c1"

    tools = _tools([], policy=PolicyEngine(approval_tools=("pick_color",)))
    llm = ScriptedLLM(
        [
            reply(tool_calls=[call("pick_color", hint="x", call_id="c1")]),
            reply(tool_calls=[call("pick_color", hint="y", call_id="c2")]),
            "ok",
        ]
    )
    agent = AgentExecutor(llm, config=CONFIG, tools=tools, approval=approver)
    first = await agent.run("go")
    assert [d.call_id for d in first.deferred] == ["c1"] and asked == ["c1"]
    second = await agent.send(results=DeferredResults(calls={"c1": ToolResult.error("closed")}))
    assert asked == ["c1", "c2"] and second.stop_reason is StopReason.ANSWERED
    assert [u.error_kind for u in second.tool_uses] == ["reported", "not_approved"]


async def test_a_stored_session_resumed_elsewhere_takes_up_the_answers() -> None:
    store = InMemorySessionStore()
    llm = ScriptedLLM([reply(tool_calls=[call("pick_color", hint="x", call_id="c1")])])
    agent = AgentExecutor(llm, config=CONFIG, tools=_tools([]), store=store)
    await agent.run("go")
    assert agent.session_id is not None
    again = await AgentExecutor.resume(
        store, agent.session_id, ScriptedLLM(["thanks"]), config=CONFIG, tools=_tools([])
    )
    outcome = await again.send(results=DeferredResults(calls={"c1": "blue"}))
    assert outcome.final_text == "thanks"
    state = await store.load(agent.session_id)
    assert [type(e).__name__ for e in state.entries][-3:] == [
        "ToolCallEntry",
        "ToolResultEntry",
        "AgentMessage",
    ]


# -- the invariant over any mix of calls and answers -----------------------------------------

_CALLS = st.lists(st.sampled_from(["echo", "pick_color", "delete"]), min_size=1, max_size=4)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(_CALLS, min_size=1, max_size=4),
    answers=st.lists(st.sampled_from(["yes", "no", "error", "skip"]), min_size=16, max_size=16),
)
async def test_any_mix_of_calls_and_answers_keeps_every_call_answered_once(
    turns: list[list[str]], answers: list[str]
) -> None:
    script: list[Any] = []
    for t, names in enumerate(turns):
        calls = []
        for c, name in enumerate(names):
            arguments = {"echo": {"text": "hi"}, "pick_color": {"hint": "h"}}.get(
                name, {"path": f"p{t}.{c}"}
            )
            calls.append(call(name, arguments, call_id=f"t{t}c{c}"))
        script.append(reply(tool_calls=calls))
    script.append(reply("done"))
    ran: list[str] = []
    llm = ScriptedLLM(script)
    agent = AgentExecutor(llm, config=CONFIG, tools=_tools(ran))
    outcome = await agent.run("go", defer_approvals=True)
    approved: list[str] = []
    supply = iter(answers)
    for t, names in enumerate(turns):
        handed = [f"t{t}c{c}" for c, name in enumerate(names) if name != "echo"]
        if not handed:
            continue
        assert outcome.stop_reason is StopReason.DEFERRED
        assert [d.call_id for d in outcome.deferred] == handed
        assert_units_intact(llm.requests[-1].messages)
        calls: dict[str, ToolResult] = {}
        approvals: dict[str, ApprovalResponse] = {}
        for deferred in outcome.deferred:
            answer = next(supply)
            if answer == "skip":
                continue
            if deferred.kind == "external":
                calls[deferred.call_id] = ToolResult(content=answer, is_error=answer == "error")
            else:
                approvals[deferred.call_id] = ApprovalResponse(approved=answer == "yes")
                if answer == "yes":
                    approved.append(json.loads(deferred.arguments)["path"])
        results = DeferredResults(calls=calls, approvals=approvals) if calls or approvals else None
        complete = len(calls) + len(approvals) == len(handed)
        outcome = await agent.send(
            None if complete else "go on", results=results, defer_approvals=True
        )
    assert outcome.stop_reason is StopReason.ANSWERED
    assert ran == approved, "exactly the approved calls ran, in order"
    assert_units_intact(agent.history)
    for request in llm.requests:
        assert_units_intact(request.messages)
    made = [e.call_id for e in agent.history.entries if isinstance(e, ToolCallEntry)]
    answered = [e.call_id for e in agent.history.entries if isinstance(e, ToolResultEntry)]
    assert sorted(made) == sorted(answered)


@given(
    calls=st.dictionaries(st.text(min_size=1, max_size=4), st.text(max_size=5), max_size=3),
    approvals=st.dictionaries(st.text(min_size=1, max_size=4), st.booleans(), max_size=3),
)
def test_answers_and_deferred_calls_round_trip_through_json(
    calls: dict[str, str], approvals: dict[str, bool]
) -> None:
    answers = DeferredResults(calls=calls, approvals=approvals)
    assert {k: v.content for k, v in answers.calls.items()} == calls
    assert {k: v.approved for k, v in answers.approvals.items()} == approvals
    assert DeferredResults.model_validate_json(answers.model_dump_json()) == answers
    deferred = DeferredCall(call_id="c", name="n", arguments="{}", kind="approval", reason="r")
    assert DeferredCall.model_validate_json(deferred.model_dump_json()) == deferred
