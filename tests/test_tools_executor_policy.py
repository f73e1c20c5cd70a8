"""The tool executor's policies and approvals, output limits, and handlers run through it."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow._text import truncate_to_tokens
from agent_flow.environment import Environment
from agent_flow.messages import ToolCall
from agent_flow.tokens import ApproxCounter, default_counter
from agent_flow.tools import (
    ApprovalCallback,
    ApprovalRequest,
    ApprovalResponse,
    HandlerRegistry,
    PolicyEngine,
    RiskLevel,
    ToolContext,
    ToolExecutor,
    ToolPolicy,
    ToolResult,
    tool,
)
from agent_flow.tools._truncation import cut_marker
from tests.helpers import tool_call as call
from tests.tools_helpers import RecordingHooks, explode, search

# --- policy and approvals -----------------------------------------------------------------

risky_policy = ToolPolicy(requires_approval=True, risk=RiskLevel.MEDIUM)


@tool(policy=risky_policy)
def delete(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


async def test_a_call_needing_approval_runs_once_approved() -> None:
    requests: list[ApprovalRequest] = []

    async def approve(request: ApprovalRequest) -> bool:
        requests.append(request)
        return True

    hooks = RecordingHooks()
    executor = ToolExecutor([delete], approval=approve, hooks=hooks)
    outcome = await executor.execute_one(call("delete", '{"path": "a.txt"}'))
    assert outcome.result.content == "deleted a.txt"
    assert outcome.approval == ApprovalResponse(approved=True)
    assert requests == [
        ApprovalRequest(
            call_id="1",
            tool_name="delete",
            arguments={"path": "a.txt"},
            reason="tool 'delete' requires approval",
            risk=RiskLevel.MEDIUM,
        )
    ]
    assert hooks.events == [
        ("started", "1"),
        ("approval_required", "1", "tool 'delete' requires approval"),
        ("approval_resolved", "1", "True"),
        ("finished", "1", "ok"),
    ]


async def test_each_execute_call_is_answered_by_its_own_approver() -> None:
    asked: dict[str, list[str]] = {"default": [], "first": [], "second": []}
    both_asked = asyncio.Event()

    def approver(who: str, answer: bool) -> ApprovalCallback:
        async def answer_it(request: ApprovalRequest) -> bool:
            asked[who].append(request.call_id)
            if len(asked["first"]) + len(asked["second"]) == 2:
                both_asked.set()
            await both_asked.wait()  # both turns are waiting for an answer at once
            return answer

        return answer_it

    executor = ToolExecutor([delete], approval=approver("default", True))
    first, second = await asyncio.gather(
        executor.execute([call("delete", '{"path": "a"}', "a1")], approval=approver("first", True)),
        executor.execute(
            [call("delete", '{"path": "b"}', "b1")], approval=approver("second", False)
        ),
    )
    assert asked == {"default": [], "first": ["a1"], "second": ["b1"]}
    assert first[0].result.content == "deleted a"
    assert second[0].result.error_kind == "not_approved"
    # Without one of its own, a call is answered by the executor's approver.
    (third,) = await executor.execute([call("delete", '{"path": "c"}', "c1")])
    assert (third.result.content, asked["default"]) == ("deleted c", ["c1"])


async def test_an_unapproved_call_becomes_an_error_result_with_the_reason() -> None:
    async def refuse_it(request: ApprovalRequest) -> ApprovalResponse:
        return ApprovalResponse(approved=False, reason="keep that file")

    outcome = await ToolExecutor([delete], approval=refuse_it).execute_one(
        call("delete", '{"path": "a"}')
    )
    assert outcome.result.error_kind == "not_approved"
    assert outcome.result.content == (
        "the user did not approve the call to 'delete': keep that file; do not repeat it unchanged"
    )


async def test_without_an_approver_calls_needing_approval_are_refused() -> None:
    outcome = await ToolExecutor([delete]).execute_one(call("delete", '{"path": "a"}'))
    assert outcome.result.error_kind == "not_approved"
    assert "no approver is configured" in outcome.result.content


async def test_auto_approve_runs_calls_without_asking() -> None:
    async def never(request: ApprovalRequest) -> bool:
        raise AssertionError("must not be asked")

    executor = ToolExecutor([delete], policy=PolicyEngine(auto_approve=True), approval=never)
    outcome = await executor.execute_one(call("delete", '{"path": "a"}'))
    assert outcome.result.content == "deleted a"
    assert outcome.decision is not None
    assert outcome.decision.reason == "auto-approved: tool 'delete' requires approval"


async def test_a_denied_call_never_runs() -> None:
    executor = ToolExecutor([delete], policy=PolicyEngine(denied_tools=["del*"]))
    outcome = await executor.execute_one(call("delete", '{"path": "a"}'))
    assert outcome.result.error_kind == "denied"
    assert (
        outcome.result.content
        == "the call to 'delete' was denied: tool 'delete' is denied by policy"
    )


async def test_an_approver_that_hangs_or_raises_means_not_approved() -> None:
    async def hang(request: ApprovalRequest) -> bool:
        await asyncio.Event().wait()
        return True

    async def crash(request: ApprovalRequest) -> bool:
        raise RuntimeError("ui gone")

    slow = ToolExecutor([delete], approval=hang, approval_timeout=0.01)
    outcome = await slow.execute_one(call("delete", '{"path": "a"}'))
    assert "no answer within 0.01s" in outcome.result.content
    broken = ToolExecutor([delete], approval=crash)
    outcome = await broken.execute_one(call("delete", '{"path": "a"}'))
    assert "asking for approval failed (ui gone)" in outcome.result.content


@pytest.mark.parametrize("when", ["before", "with the deadline", "just past it", "after"])
async def test_an_answer_given_as_the_approval_timeout_falls_due_is_the_one_the_call_gets(
    when: str,
) -> None:
    """The approver's user is told "taken" exactly when the call acts on the answer."""
    timeout = 0.05
    answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    cleaned: list[str] = []

    async def ask(request: ApprovalRequest) -> bool:
        try:
            return await answer
        finally:
            cleaned.append(request.call_id)

    def give() -> bool:  # the approver's UI: True when its user's answer was taken
        if answer.done():
            return False
        answer.set_result(True)
        return True

    executor = ToolExecutor([delete], approval=ask, approval_timeout=timeout)
    running = asyncio.create_task(executor.execute_one(call("delete", '{"path": "a"}')))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # it waits for the answer, its deadline `timeout` away
    loop = asyncio.get_running_loop()
    taken: list[bool] = []
    if when == "before":
        taken.append(give())
    elif when == "with the deadline":
        # The loop busy past the deadline: on its next turn the answer (the earlier timer) is
        # given first, then the deadline falls due.
        loop.call_at(loop.time(), lambda: taken.append(give()))
        time.sleep(2 * timeout)  # noqa: ASYNC251 (the loop must be busy past the deadline)
    elif when == "just past it":
        # Due in the deadline's turn, after it: the wait's timer has woken the executor, whose
        # step comes before the approver's.
        loop.call_at(loop.time() + timeout + 0.001, lambda: taken.append(give()))
        time.sleep(2 * timeout)  # noqa: ASYNC251 (the loop must be busy past the deadline)
    outcome = await asyncio.wait_for(running, 5)
    if when == "after":  # the asking was cancelled at the deadline, and its future with it
        taken.append(give())
    assert taken == [when != "after"]
    assert (outcome.result.content == "deleted a") is taken[0]
    if not taken[0]:
        assert f"no answer within {timeout:g}s" in outcome.result.content
    assert cleaned == ["1"]  # the approver finished before the call went on


async def test_an_approver_cancelled_on_its_own_is_no_answer_and_not_a_timeout() -> None:
    ui_closed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def ask(request: ApprovalRequest) -> bool:
        return await ui_closed

    executor = ToolExecutor([delete], approval=ask, approval_timeout=30)
    running = asyncio.create_task(executor.execute_one(call("delete", '{"path": "a"}')))
    await asyncio.sleep(0.01)
    ui_closed.cancel()  # the approver's UI went away: the run goes on, the call is refused
    outcome = await asyncio.wait_for(running, 5)
    assert outcome.result.error_kind == "not_approved"
    assert "asking for approval failed (the approver was cancelled)" in outcome.result.content


async def test_a_run_cancelled_while_it_waits_for_approval_cancels_the_asking() -> None:
    cleaned: list[str] = []

    async def ask(request: ApprovalRequest) -> bool:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(request.call_id)
        return True

    executor = ToolExecutor([delete], approval=ask, approval_timeout=30)
    running = asyncio.create_task(executor.execute_one(call("delete", '{"path": "a"}')))
    await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cleaned == ["1"]


async def test_a_registration_policy_overrides_the_tools_own() -> None:
    executor = ToolExecutor()
    executor.register(delete, name="delete_freely", policy=ToolPolicy())
    outcome = await executor.execute_one(call("delete_freely", '{"path": "a"}'))
    assert outcome.result.content == "deleted a"


# --- output limits ------------------------------------------------------------------------


async def test_a_large_result_is_truncated_with_a_marker_and_handlers_see_all_of_it() -> None:
    @tool
    def dump(lines: int) -> str:
        """Produce many lines."""
        return "\n".join(f"line {i}: some words to count here" for i in range(lines))

    seen: list[str] = []

    def capture(env: Environment, c: ToolCall, result: ToolResult) -> None:
        seen.append(result.content)

    handlers = HandlerRegistry()
    handlers.register("dump", capture)
    executor = ToolExecutor([dump], max_output_tokens=100, handlers=handlers)
    outcome = await executor.execute_one(call("dump", '{"lines": 500}'), environment=Environment())
    counter = default_counter()
    shown = outcome.result
    assert shown.truncated
    assert counter.count(shown.content) <= 100
    assert shown.original_tokens == counter.count(outcome.full_result.content)
    assert re.search(r"\[\.\.\. truncated: \d+ of \d+ tokens cut", shown.content)
    assert outcome.full_result.content.startswith(shown.content.split("\n[... truncated")[0])
    assert not outcome.full_result.truncated
    assert seen == [outcome.full_result.content]


async def test_a_per_tool_output_limit_overrides_the_default() -> None:
    executor = ToolExecutor(max_output_tokens=10_000)
    executor.register(search, max_output_tokens=40)
    outcome = await executor.execute_one(call("search", '{"query": "word", "limit": 200}'))
    assert outcome.result.truncated
    small = await executor.execute_one(call("search", '{"query": "w", "limit": 1}'))
    assert not small.result.truncated
    assert small.result.original_tokens == default_counter().count(small.result.content)


@given(
    text=st.text(min_size=0, max_size=3000),
    limit=st.integers(min_value=32, max_value=400),
)
def test_truncation_never_exceeds_the_limit_and_keeps_a_prefix(text: str, limit: int) -> None:
    counter = default_counter()
    result, original = truncate_to_tokens(
        text, limit, counter.count, marker=cut_marker, at_line_break=True
    )
    assert original == counter.count(text)
    assert counter.count(result) <= limit
    if original <= limit:
        assert result == text
    else:
        head, _, marker = result.partition("\n[... truncated: ")
        assert text.startswith(head)
        assert marker.startswith(f"{original - counter.count(head)} of {original} tokens cut")


def test_truncation_works_with_any_counter() -> None:
    text = "x" * 10_000
    result, original = truncate_to_tokens(text, 50, ApproxCounter().count, marker=cut_marker)
    assert original == 2500
    assert ApproxCounter().count(result) <= 50


# --- handlers through the executor --------------------------------------------------------


async def test_a_handler_that_raises_keeps_the_result_and_reports_the_error() -> None:
    def broken(env: Environment, c: ToolCall, result: ToolResult) -> None:
        env.set("/extensions/partial", 1)
        raise ValueError("bad handler")

    handlers = HandlerRegistry()
    handlers.register("search", broken)
    env = Environment()
    outcome = await ToolExecutor([search], handlers=handlers).execute_one(
        call("search", '{"query": "q", "limit": 1}'), environment=env
    )
    assert outcome.result.data == ["q-0"]
    assert len(outcome.handler_errors) == 1
    error = outcome.handler_errors[0]
    assert (error.pattern, error.error_type, error.message, error.tool_name) == (
        "search",
        "ValueError",
        "bad handler",
        "search",
    )
    assert [c.pointer for c in outcome.environment_changes] == ["/extensions/partial"]


async def test_the_default_handler_records_results_and_the_changes_are_reported() -> None:
    env = Environment()
    executor = ToolExecutor()
    executor.register(search, name="lookup")  # no built-in handler matches "lookup"
    outcome = await executor.execute_one(
        call("lookup", '{"query": "q", "limit": 1}'), environment=env
    )
    assert [c.pointer for c in outcome.environment_changes] == ["/extensions/tool_results/lookup"]
    assert env.get("/extensions/tool_results/lookup/data") == ["q-0"]


async def test_error_results_and_runs_without_an_environment_skip_the_handlers() -> None:
    env = Environment()
    executor = ToolExecutor([explode, search])
    failed = await executor.execute_one(call("explode", '{"message": "x"}'), environment=env)
    assert failed.environment_changes == ()
    assert env.version == 0
    plain = await executor.execute_one(call("search", '{"query": "q"}'))
    assert plain.environment_changes == ()


async def test_tools_receive_the_environment_and_run_id_in_their_context() -> None:
    @tool
    async def note(text: str, ctx: ToolContext) -> str:
        """Write a note into the environment."""
        assert ctx.environment is not None
        ctx.environment.set("/extensions/notes", [text])
        return ctx.run_id

    env = Environment()
    executor = ToolExecutor([note], handlers=HandlerRegistry())
    outcome = await executor.execute_one(
        call("note", '{"text": "hi"}'), run_id="run-7", environment=env
    )
    assert outcome.result.content == "run-7"
    assert env.get("/extensions/notes") == ["hi"]


async def test_a_failure_inside_the_executor_itself_becomes_an_error_result() -> None:
    def broken_rule(name: str, policy: ToolPolicy, arguments: object) -> None:
        raise RuntimeError("rule bug")

    hooks = RecordingHooks()
    executor = ToolExecutor([search], policy=PolicyEngine(rules=[broken_rule]), hooks=hooks)
    outcome, other = await executor.execute(
        [call("search", '{"query": "q"}', "1"), call("nope", "{}", "2")]
    )
    assert outcome.result.error_kind == "exception"
    assert outcome.result.content == "the call to 'search' failed before it could run: rule bug"
    assert other.result.error_kind == "unknown_tool"
    assert ("finished", "1", "exception") in hooks.events


async def test_a_problem_the_llm_layer_found_reaches_the_model_as_an_invalid_call() -> None:
    bad = ToolCall.from_raw("c1", "search", '{"query": "x"}', problem="the XML block is cut")

    outcome = await ToolExecutor([search]).execute_one(bad)

    assert outcome.result.error_kind == "invalid_json"
    assert outcome.result.content == "the XML block is cut"
