from __future__ import annotations

import asyncio
import re
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_flow._text import truncate_to_tokens
from agent_flow.environment import Environment
from agent_flow.errors import DuplicateToolError, ToolDefinitionError, ToolError, UserError
from agent_flow.messages import ToolCall
from agent_flow.tokens import ApproxCounter, default_counter
from agent_flow.tools import (
    MAX_TOOL_NAME_LENGTH,
    ApprovalCallback,
    ApprovalRequest,
    ApprovalResponse,
    BaseTool,
    HandlerRegistry,
    PolicyEngine,
    RiskLevel,
    Tool,
    ToolContext,
    ToolExecutor,
    ToolHooks,
    ToolPolicy,
    ToolResult,
    provider_tool_name,
    tool,
)
from agent_flow.tools._truncation import cut_marker
from tests.helpers import tool_call as call

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@tool
def search(query: str, limit: int = 5) -> list[str]:
    """Search things.

    Args:
        query: What to look for.
        limit: How many results.
    """
    return [f"{query}-{i}" for i in range(limit)]


@tool
async def explode(message: str) -> str:
    """Raise an unexpected error."""
    raise RuntimeError(message)


@tool
async def refuse(message: str) -> str:
    """Raise a ToolError meant for the model."""
    raise ToolError(message)


# --- registry -----------------------------------------------------------------------------


def test_registering_a_duplicate_name_raises_a_clear_error() -> None:
    executor = ToolExecutor([search])
    with pytest.raises(DuplicateToolError, match="'search' is already registered"):
        executor.register(search)


def test_a_namespace_prefixes_the_name_and_avoids_the_collision() -> None:
    executor = ToolExecutor([search])
    assert executor.register(search, namespace="github") == "github_search"
    assert executor.names == ["search", "github_search"]
    assert [d.name for d in executor.definitions()] == ["search", "github_search"]
    assert executor.definitions(names=["github_search"])[0].description == "Search things."


def test_plain_functions_are_wrapped_as_tools_on_registration() -> None:
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    executor = ToolExecutor()
    assert executor.register(double) == "double"
    assert "double" in executor


def test_register_all_is_all_or_nothing() -> None:
    executor = ToolExecutor([search])

    @tool(name="search")
    def other(q: str) -> str:
        """Another search."""
        return q

    with pytest.raises(DuplicateToolError):
        executor.register_all([explode, other])
    assert executor.names == ["search"]


def test_names_with_invalid_characters_are_made_provider_safe() -> None:
    assert provider_tool_name("read.file", namespace="my server") == "my_server_read_file"


def named(name: str) -> Tool:
    @tool(name=name)
    def function(x: int) -> str:
        """Return which tool ran."""
        return f"{name} {x}"

    return function


@given(
    names=st.lists(
        st.sampled_from(["get_sum", "get.sum", "get/sum", "get sum", "get-sum"]),
        min_size=1,
        max_size=5,
        unique=True,
    ),
    one_by_one=st.booleans(),
)
def test_names_that_differ_only_in_refused_characters_are_all_registered_apart(
    names: list[str], one_by_one: bool
) -> None:
    executor = ToolExecutor()
    tools = [named(n) for n in names]
    if one_by_one:
        for item in tools:
            executor.register(item, namespace="srv")
    else:
        executor.register_all(tools, namespace="srv")
    registered = executor.tools
    assert len(registered) == len(names)
    assert all(NAME_RE.match(n) for n in registered)
    by_source = {r.source_name: n for n, r in registered.items()}
    # Whatever the order: a name that needs no change keeps it; look-alikes get a suffix.
    for name in names:
        exposed = by_source[f"srv_{name}"]
        if name in ("get_sum", "get-sum"):
            assert exposed == f"srv_{name}"
        elif "get_sum" in names:
            assert re.fullmatch(r"srv_get_sum_[0-9a-f]{8}", exposed)
        else:
            assert re.fullmatch(r"srv_get_sum(_[0-9a-f]{8})?", exposed)


async def test_a_tool_moved_by_a_look_alike_is_called_under_its_new_name() -> None:
    executor = ToolExecutor()
    first = executor.register(named("get.sum"))
    assert first == "get_sum"
    assert executor.register(named("get_sum")) == "get_sum"
    (moved,) = [n for n in executor.names if n != "get_sum"]
    assert moved.startswith("get_sum_")
    assert executor.definitions(names=[moved])[0].name == moved
    call = ToolCall(id="1", name=moved, arguments='{"x": 1}')
    assert (await executor.execute_one(call)).result.content == "get.sum 1"
    with pytest.raises(DuplicateToolError):
        executor.register(named("get.sum"))


def test_long_names_are_shortened_deterministically_and_stay_distinct() -> None:
    a = provider_tool_name("a" * 70)
    b = provider_tool_name("a" * 69 + "b")
    assert len(a) == len(b) == MAX_TOOL_NAME_LENGTH
    assert a != b
    assert a == provider_tool_name("a" * 70)
    assert a.startswith("a" * 55 + "_")


@given(
    name=st.text(min_size=1, max_size=120),
    namespace=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
)
def test_every_registered_name_fits_what_providers_accept(name: str, namespace: str | None) -> None:
    assert NAME_RE.match(provider_tool_name(name, namespace=namespace))


@given(names=st.lists(st.text(alphabet="ab_", min_size=60, max_size=80), unique=True, max_size=8))
def test_distinct_long_names_never_collide(names: list[str]) -> None:
    assert len({provider_tool_name(n) for n in names}) == len(names)


def test_an_empty_name_is_rejected() -> None:
    with pytest.raises(ToolDefinitionError, match="cannot be empty"):
        provider_tool_name("")


def test_a_tool_with_an_invalid_schema_is_rejected() -> None:
    class Broken(BaseTool):
        name = "broken"
        parameters = {"type": "object", "properties": {"x": {"type": "nonsense"}}}  # noqa: RUF012

    with pytest.raises(ToolDefinitionError, match="not a valid JSON schema"):
        ToolExecutor([Broken()])


def test_a_non_object_schema_is_rejected() -> None:
    class Listy(BaseTool):
        name = "listy"
        parameters = {"type": "array"}  # noqa: RUF012

    with pytest.raises(ToolDefinitionError, match="must have type 'object'"):
        ToolExecutor([Listy()])


def test_unregister_and_unknown_definitions_raise_user_errors() -> None:
    executor = ToolExecutor([search])
    executor.unregister("search")
    assert len(executor) == 0
    with pytest.raises(UserError, match="no tool named 'search'"):
        executor.unregister("search")
    with pytest.raises(UserError, match="'nope'"):
        executor.definitions(names=["nope"])


def test_a_tiny_output_limit_is_a_usage_error() -> None:
    with pytest.raises(UserError, match="too small"):
        ToolExecutor(max_output_tokens=5)


# --- errors become results ----------------------------------------------------------------


async def test_a_successful_call_returns_content_and_data() -> None:
    outcome = await ToolExecutor([search]).execute_one(call("search", '{"query": "x", "limit": 2}'))
    result = outcome.result
    assert (result.content, result.data, result.is_error) == (
        '["x-0","x-1"]',
        ["x-0", "x-1"],
        False,
    )
    assert (result.call_id, result.tool_name) == ("1", "search")
    assert result.duration_seconds >= 0
    assert outcome.decision is not None
    assert outcome.decision.verdict == "allowed"
    message = outcome.to_message()
    assert (message.role, message.tool_call_id, message.name) == ("tool", "1", "search")


async def test_unknown_tools_get_an_error_naming_close_matches_and_the_available_tools() -> None:
    outcome = await ToolExecutor([search, explode]).execute_one(call("serach"))
    assert outcome.result.is_error
    assert outcome.result.error_kind == "unknown_tool"
    assert outcome.result.content == (
        "unknown tool 'serach'; did you mean 'search'? available: search, explode"
    )
    assert outcome.decision is None


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("{not json", "the arguments are not valid JSON (Expecting property name"),
        ("[1, 2]", "the arguments must be a JSON object, not a JSON array"),
    ],
)
async def test_invalid_json_arguments_become_error_results(arguments: str, expected: str) -> None:
    outcome = await ToolExecutor([search]).execute_one(call("search", arguments))
    assert outcome.result.error_kind == "invalid_json"
    assert outcome.result.content.startswith(expected)


async def test_empty_and_double_encoded_arguments_are_accepted() -> None:
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    executor = ToolExecutor([ping, search])
    assert (await executor.execute_one(call("ping", ""))).result.content == "pong"
    doubled = '"{\\"query\\": \\"q\\", \\"limit\\": 1}"'
    assert (await executor.execute_one(call("search", doubled))).result.data == ["q-0"]


async def test_arguments_are_validated_against_the_schema_before_the_call() -> None:
    calls: list[int] = []

    @tool
    def pick(option: Literal["a", "b"], count: int) -> str:
        """Pick an option."""
        calls.append(count)
        return option

    outcome = await ToolExecutor([pick]).execute_one(
        call("pick", '{"option": "c", "count": "3", "extra": 1}')
    )
    assert outcome.result.error_kind == "invalid_arguments"
    assert calls == []
    assert outcome.result.content == (
        "invalid arguments for tool 'pick': Additional properties are not allowed "
        "('extra' was unexpected); count: '3' is not of type 'integer'; option: 'c' is not one "
        "of ['a', 'b']. Expected: {option: \"a\" | \"b\", count: integer}"
    )


async def test_exceptions_and_tool_errors_become_error_results() -> None:
    executor = ToolExecutor([explode, refuse])
    crashed, refused = await executor.execute(
        [
            call("explode", '{"message": "boom"}', "1"),
            call("refuse", '{"message": "use another path"}', "2"),
        ]
    )
    assert crashed.result.error_kind == "exception"
    assert crashed.result.content == "tool 'explode' failed with RuntimeError: boom"
    assert refused.result.error_kind == "tool_error"
    assert refused.result.content == "use another path"
    assert crashed.result.failed
    assert refused.result.failed


async def test_a_tool_reporting_an_error_itself_is_marked_reported() -> None:
    @tool
    def check(path: str) -> ToolResult:
        """Check a path."""
        return ToolResult(content=f"{path} is missing", is_error=True)

    outcome = await ToolExecutor([check]).execute_one(call("check", '{"path": "a"}'))
    assert outcome.result.error_kind == "reported"
    assert outcome.result.is_error
    assert not outcome.result.failed


async def test_a_tool_that_runs_past_its_timeout_is_stopped_with_an_error_result() -> None:
    stopped = asyncio.Event()

    @tool(timeout=0.05)
    async def stuck() -> str:
        """Never finish."""
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "unreachable"

    outcome = await ToolExecutor([stuck]).execute_one(call("stuck"))
    assert outcome.result.error_kind == "timeout"
    assert outcome.result.content == (
        "tool 'stuck' did not finish within 0.05s and was stopped; try a smaller request"
    )
    assert stopped.is_set()


async def test_the_default_timeout_applies_to_tools_without_their_own() -> None:
    @tool
    async def stuck() -> str:
        """Never finish."""
        await asyncio.Event().wait()
        return "unreachable"

    executor = ToolExecutor([stuck], default_timeout=0.05)
    assert (await executor.execute_one(call("stuck"))).result.error_kind == "timeout"
    executor.unregister("stuck")
    executor.register(stuck, timeout=0.01)
    outcome = await executor.execute_one(call("stuck"))
    assert "within 0.01s" in outcome.result.content


async def test_a_timeout_error_raised_by_the_tool_itself_is_an_exception_not_a_timeout() -> None:
    @tool
    async def upstream() -> str:
        """Fail like a slow upstream."""
        raise TimeoutError("upstream took too long")

    outcome = await ToolExecutor([upstream]).execute_one(call("upstream"))
    assert outcome.result.error_kind == "exception"
    assert "upstream took too long" in outcome.result.content


async def test_a_tool_that_cancels_itself_does_not_cancel_the_run() -> None:
    @tool
    async def quitter() -> str:
        """Raise CancelledError without being cancelled."""
        raise asyncio.CancelledError

    outcome = await ToolExecutor([quitter, search]).execute_one(call("quitter"))
    assert outcome.result.error_kind == "exception"
    assert outcome.result.content == "tool 'quitter' was cancelled"


# --- concurrency and cancellation ---------------------------------------------------------


async def test_calls_run_concurrently_and_results_keep_call_order() -> None:
    second_started = asyncio.Event()
    finished: list[str] = []

    @tool
    async def first() -> str:
        """Wait until the second call has started: only possible if both run at once."""
        await second_started.wait()
        finished.append("first")
        return "first"

    @tool
    async def second() -> str:
        """Start, then finish before the first."""
        second_started.set()
        finished.append("second")
        return "second"

    outcomes = await ToolExecutor([first, second]).execute(
        [call("first", call_id="a"), call("second", call_id="b")]
    )
    assert finished == ["second", "first"]
    assert [o.result.content for o in outcomes] == ["first", "second"]
    assert [o.call.id for o in outcomes] == ["a", "b"]


async def test_max_concurrency_limits_how_many_calls_run_at_once() -> None:
    running = 0
    peak = 0

    @tool
    async def busy(n: int) -> int:
        """Be busy for a few scheduler turns."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        for _ in range(3):
            await asyncio.sleep(0)
        running -= 1
        return n

    executor = ToolExecutor([busy], max_concurrency=2)
    outcomes = await executor.execute([call("busy", f'{{"n": {i}}}', str(i)) for i in range(6)])
    assert [o.result.data for o in outcomes] == list(range(6))
    assert peak == 2


async def test_cancelling_the_run_cancels_running_tools() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @tool
    async def long_job() -> str:
        """Run until cancelled."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    task = asyncio.create_task(ToolExecutor([long_job]).execute([call("long_job")]))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


# --- hooks --------------------------------------------------------------------------------


class RecordingHooks(ToolHooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    async def call_started(self, call: ToolCall) -> None:
        self.events.append(("started", call.id))

    async def progress(
        self, call: ToolCall, progress: float, total: float | None, message: str | None
    ) -> None:
        self.events.append(("progress", call.id, f"{progress}/{total}", message or ""))

    async def approval_required(self, call: ToolCall, request: ApprovalRequest) -> None:
        self.events.append(("approval_required", call.id, request.reason))

    async def approval_resolved(self, call: ToolCall, response: ApprovalResponse) -> None:
        self.events.append(("approval_resolved", call.id, str(response.approved)))

    async def call_finished(self, call: ToolCall, result: ToolResult) -> None:
        self.events.append(("finished", call.id, result.error_kind or "ok"))


async def test_hooks_see_start_progress_and_finish_of_every_call() -> None:
    @tool
    async def steps(ctx: ToolContext) -> str:
        """Report progress."""
        await ctx.report_progress(1, 2, "half")
        return "done"

    hooks = RecordingHooks()
    await ToolExecutor([steps], hooks=hooks).execute(
        [call("steps", call_id="1"), call("nope", call_id="2")]
    )
    assert sorted(hooks.events) == sorted(
        [
            ("started", "1"),
            ("progress", "1", "1/2", "half"),
            ("finished", "1", "ok"),
            ("started", "2"),
            ("finished", "2", "unknown_tool"),
        ]
    )


async def test_a_hook_that_raises_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenHooks(ToolHooks):
        async def call_started(self, call: ToolCall) -> None:
            raise RuntimeError("hook bug")

    outcome = await ToolExecutor([search], hooks=BrokenHooks()).execute_one(
        call("search", '{"query": "q", "limit": 1}')
    )
    assert outcome.result.data == ["q-0"]
    assert "a tool hook raised" in caplog.text


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
